# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet CA and a node's key and certificate as they are on the controller, read in-process. Reads files,
writes nothing.

The identity role makes and checks these files with community.crypto's modules, one module run each. A re-run
finds them all in place, so it first reads them here, in the controller's own process, and goes to those modules
only when something is missing, has another mode, or its certificate must be issued again. What counts as "in
place" is what the modules would leave unchanged: a directory with mode 0700, a key file with mode 0600 (never
regenerated, whatever it holds), the CA certificate present, the node's certificate readable.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import stat

try:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509.oid import NameOID

    HAS_CRYPTOGRAPHY = True
except ImportError:  # the identity role then takes the module route, which names what is missing
    HAS_CRYPTOGRAPHY = False

DIR_MODE = 0o700
KEY_MODE = 0o600


def _mode(path):
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None


def _check_dir(path, problems):
    if not os.path.isdir(path):
        problems.append("{} is not there".format(path))
    elif _mode(path) != DIR_MODE:
        problems.append("{} has mode {:04o}, not {:04o}".format(path, _mode(path), DIR_MODE))


def _check_key(path, problems):
    mode = _mode(path)
    if mode is None or not os.path.isfile(path):
        problems.append("{} is not there".format(path))
    elif mode != KEY_MODE:
        problems.append("{} has mode {:04o}, not {:04o}".format(path, mode, KEY_MODE))


def _fingerprint(der):
    digest = hashlib.sha256(der).hexdigest()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def certificate_info(pem, renewal_days, now=None):
    """The parts of community.crypto.x509_certificate_info's answer that the identity role reads: the subject's CN,
    the SANs (``DNS:name``, ``IP:address``), whether it is valid at the end of the renewal window
    (``valid_at.renewal_window``) and its SHA-256 fingerprint (``fingerprints.sha256``), in the same forms."""
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    sans = []
    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        extension = []
    for name in extension:
        if isinstance(name, x509.DNSName):
            sans.append("DNS:" + name.value)
        elif isinstance(name, x509.IPAddress):
            sans.append("IP:" + str(name.value))
    now = now or datetime.datetime.now(datetime.timezone.utc)
    at = now + datetime.timedelta(days=renewal_days)
    return {
        "subject": {"commonName": names[0].value if names else None},
        "subject_alt_name": sans,
        "not_after": cert.not_valid_after_utc.strftime("%Y%m%d%H%M%SZ"),
        "valid_at": {"renewal_window": cert.not_valid_before_utc <= at <= cert.not_valid_after_utc},
        "fingerprints": {"sha256": _fingerprint(cert.public_bytes(Encoding.DER))},
    }


def read(ca_dir, node=None, renewal_days=30, now=None):
    """What is in ``ca_dir`` for the fleet CA and, with ``node``, for that node: ``ca_complete`` / ``node_complete``
    (nothing for the modules to make or change), ``node_cert`` (the certificate's info, or None), ``problems``
    (why something is not complete)."""
    ca_dir = os.path.expanduser(ca_dir)
    ca_problems, node_problems = [], []
    if not HAS_CRYPTOGRAPHY:
        ca_problems.append("the Python library cryptography is not installed on the controller")
    _check_dir(ca_dir, ca_problems)
    _check_key(os.path.join(ca_dir, "ca.key"), ca_problems)
    if not os.path.isfile(os.path.join(ca_dir, "ca.crt")):
        ca_problems.append("{} is not there".format(os.path.join(ca_dir, "ca.crt")))
    info = None
    if node:
        node_dir = os.path.join(ca_dir, "nodes", node)
        _check_dir(node_dir, node_problems)
        _check_key(os.path.join(node_dir, "node.key"), node_problems)
        cert = os.path.join(node_dir, "node.crt")
        if not os.path.isfile(cert):
            node_problems.append("{} is not there".format(cert))
        elif HAS_CRYPTOGRAPHY:
            try:
                with open(cert, "rb") as handle:
                    info = certificate_info(handle.read(), renewal_days, now)
            except (OSError, ValueError) as exc:
                node_problems.append("{} cannot be read as a certificate: {}".format(cert, exc))
    return {
        "ca_complete": not ca_problems,
        "node_complete": bool(node) and not ca_problems and not node_problems,
        "node_cert": info,
        "problems": ca_problems + node_problems,
    }
