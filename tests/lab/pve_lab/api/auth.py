"""Tickets, CSRF prevention tokens and API tokens, checked the way pve-access-control checks them.

A ticket is `PVE:USER:HEXTIME::SIGNATURE` (the lab signs with an HMAC where PVE uses RSA), travels as the cookie
`PVEAuthCookie` and lives two hours; writes made with a ticket need the `CSRFPreventionToken` header. API tokens
travel as `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET` and need no CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from typing import Callable, Dict, Optional
from urllib.parse import unquote

from pve_lab.api.constants import FLEET_TOKEN_NAME, FLEET_USER, TOKEN_NAME, USER
from pve_lab.api.credentials import Credentials
from pve_lab.api.errors import ApiError, unauthorized

TICKET_LIFETIME = 7200
GRACE = 300
TICKET_RE = re.compile(r"^PVE:([^:\s]+):([A-F0-9]{8})::(\S+)$")
CSRF_RE = re.compile(r"^([A-F0-9]{8}):(\S+)$")
TOKEN_RE = re.compile(r"^(([^\s:/@!]+)@([A-Za-z][A-Za-z0-9.\-_]+))!([A-Za-z][A-Za-z0-9.\-_]+)$")
UNAUTHENTICATED = {("GET", "/access/ticket"), ("POST", "/access/ticket"), ("GET", "/access/domains")}


class Authenticator:
    def __init__(self, creds: Credentials, lifetime: Callable[[], float] = lambda: TICKET_LIFETIME):
        self._creds = creds
        self._key = creds.ticket_key.encode()
        self._lifetime = lifetime  # the lab's `ticket_lifetime` fault shortens it

    def _sign(self, text: str) -> str:
        digest = hmac.new(self._key, text.encode(), hashlib.sha256).digest()
        return base64.b64encode(digest).decode().rstrip("=")

    def _fresh(self, hextime: str) -> bool:
        age = time.time() - int(hextime, 16)
        return -GRACE <= age <= self._lifetime()

    def make_ticket(self, username: str) -> str:
        plain = "PVE:%s:%08X" % (username, int(time.time()))
        return "%s::%s" % (plain, self._sign(plain))

    def make_csrf(self, username: str) -> str:
        stamp = "%08X" % int(time.time())
        return "%s:%s" % (stamp, self._sign("%s:%s" % (stamp, username)))

    def ticket_user(self, ticket: str) -> Optional[str]:
        match = TICKET_RE.match(ticket or "")
        if not match:
            return None
        username, hextime, signature = match.groups()
        expected = self._sign("PVE:%s:%s" % (username, hextime))
        if not hmac.compare_digest(signature, expected) or not self._fresh(hextime):
            return None
        return username

    def csrf_valid(self, username: str, token: Optional[str]) -> bool:
        match = CSRF_RE.match(token or "")
        if not match:
            return False
        hextime, signature = match.groups()
        expected = self._sign("%s:%s" % (hextime, username))
        return hmac.compare_digest(signature, expected) and self._fresh(hextime)

    def password_ok(self, username: str, password: str) -> bool:
        if password.startswith("PVE:"):  # PVE accepts a valid ticket as password: that is how tickets are renewed
            return self.ticket_user(password) == username
        return username == USER and hmac.compare_digest(password.encode(), self._creds.password.encode())

    def verify_token(self, value: str) -> str:
        """PVE::AccessControl::verify_token, with its messages."""
        match = re.match(r"^(.*)=(.*)$", value or "")
        if not match:
            raise unauthorized("no tokenid specified")
        tokenid, secret = match.groups()
        parts = TOKEN_RE.match(tokenid)
        if not parts:
            raise unauthorized("'%s' is not a valid token ID - not able to split into user and token parts" % tokenid)
        username, token = parts.group(1), parts.group(4)
        tokens = {USER: (TOKEN_NAME, self._creds.token_secret),
                  FLEET_USER: (FLEET_TOKEN_NAME, self._creds.fleet_token_secret)}
        if username not in tokens:
            raise unauthorized("no such user ('%s')" % username)
        name, expected = tokens[username]
        if token != name:
            raise unauthorized("no such token '%s' for user '%s'" % (token, username))
        if not expected or not hmac.compare_digest(secret.encode(), expected.encode()):
            raise unauthorized("invalid token value!")
        return tokenid

    def authenticate(self, method: str, rel_path: str, headers: Dict[str, str]) -> Optional[str]:
        """The user (or `user!token`) a request acts as; None for the calls PVE allows without authentication."""
        if (method, rel_path) in UNAUTHENTICATED:
            return None
        ticket = _cookie(headers.get("cookie", ""), "PVEAuthCookie")
        authorization = headers.get("authorization", "")
        if not ticket:
            ticket = _auth_value(authorization, "PVEAuthCookie")
        if not ticket:
            api_token = _auth_value(authorization, "PVEAPIToken")
            if api_token:
                return self.verify_token(api_token)
            raise unauthorized("No ticket")
        username = self.ticket_user(ticket)
        if username is None:
            raise unauthorized("permission denied - invalid PVE ticket")
        if method != "GET" and not self.csrf_valid(username, headers.get("csrfpreventiontoken")):
            raise unauthorized("Permission denied - invalid csrf token")
        return username

    def login(self, username: str, password: str) -> Dict[str, object]:
        if not self.password_ok(username, password):
            raise ApiError(401, "authentication failure")
        return {
            "username": username,
            "ticket": self.make_ticket(username),
            "CSRFPreventionToken": self.make_csrf(username),
            "cap": {"vms": {"VM.Allocate": 1, "VM.PowerMgmt": 1, "VM.Config.Options": 1, "VM.Audit": 1},
                    "nodes": {"Sys.Audit": 1, "Sys.Modify": 1}, "storage": {"Datastore.AllocateSpace": 1}},
        }


def _cookie(header: str, name: str) -> Optional[str]:
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name and value:
            return unquote(value)
    return None


def _auth_value(header: str, name: str) -> Optional[str]:
    match = re.search(r"(?:^|\s)%s(?:=|\s)(\S+)\s*$" % re.escape(name), header or "")
    return unquote(match.group(1)) if match else None
