"""Parameter verification as pve-common's JSONSchema does it, with its messages.

Every API call checks its parameters against a schema before anything runs: unknown parameters, a missing
required one, a wrong type, a failed format or range are all one 400 "Parameter verification failed." whose
`errors` map each parameter to its message.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Union

from pve_lab.api.errors import param_error

ParamValue = Union[str, List[str]]
INTEGER_RE = re.compile(r"^[+-]?\d+$")
NUMBER_RE = re.compile(r"^[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?$")
DNS_LABEL = r"([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)"
DNS_NAME_RE = re.compile(r"^(%s\.)*%s$" % (DNS_LABEL, DNS_LABEL))
NODE_RE = re.compile(r"^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$")
VMID_RE = re.compile(r"^[1-9][0-9]{2,8}$")
URLENCODED_RE = re.compile(r"^[-%a-zA-Z0-9_.!~*'()]*$")
CONFIGID_RE = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)
STORAGE_ID_RE = re.compile(r"^[a-z][a-z0-9\-_.]*[a-z0-9]$", re.IGNORECASE)
TAG_RE = re.compile(r"^[a-z0-9_][a-z0-9_\-+.]*$", re.IGNORECASE)
MAC_RE = re.compile(r"^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$", re.IGNORECASE)


class FormatError(Exception):
    """A value does not match its format; the message is what PVE's format check dies with."""


Format = Callable[[str], None]


@dataclass(frozen=True)
class Prop:
    type: str = "string"  # string | integer | number | boolean | array
    optional: bool = True
    format: Optional[Format] = None
    pattern: Optional[str] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    max_length: Optional[int] = None
    min_length: Optional[int] = None
    enum: Optional[Sequence[str]] = None
    requires: Optional[str] = None


def required(prop: Prop) -> Prop:
    return Prop(**{**prop.__dict__, "optional": False})


def check_value(value: ParamValue, prop: Prop) -> Optional[str]:
    """The error message for one present value, None when it is valid (check_type then check_prop's order)."""
    if prop.type == "array":
        return None if isinstance(value, list) else "type check ('array') failed"
    if isinstance(value, list):
        value = "\0".join(value)
    if prop.type == "boolean" and value not in ("0", "1"):
        return "type check ('boolean') failed - got '%s'" % value
    if prop.type == "integer" and not INTEGER_RE.match(value):
        return "type check ('integer') failed - got '%s'" % value
    if prop.type == "number" and not NUMBER_RE.match(value):
        return "type check ('number') failed - got '%s'" % value
    if prop.format is not None:
        try:
            prop.format(value)
        except FormatError as err:
            return "invalid format - %s" % err
    if prop.pattern is not None and not re.match(r"^(?:%s)$" % prop.pattern, value):
        return "value does not match the regex pattern"
    if prop.max_length is not None and len(value) > prop.max_length:
        return "value may only be %d characters long" % prop.max_length
    if prop.min_length is not None and len(value) < prop.min_length:
        return "value must be at least %d characters long" % prop.min_length
    if NUMBER_RE.match(value):
        if prop.maximum is not None and float(value) > prop.maximum:
            return "value must have a maximum value of %s" % _num(prop.maximum)
        if prop.minimum is not None and float(value) < prop.minimum:
            return "value must have a minimum value of %s" % _num(prop.minimum)
    if prop.enum is not None and value not in prop.enum:
        return "value '%s' does not have a value in the enumeration '%s'" % (value, ", ".join(prop.enum))
    return None


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def check_object(values: Dict[str, ParamValue], props: Dict[str, Prop], path: str = "",
                 additional: bool = False) -> Dict[str, str]:
    """check_object: all problems of a parameter set, keyed by parameter path."""
    errors: Dict[str, str] = {}

    def add(key: str, message: str) -> None:
        key = key or "_root"
        errors[key] = errors[key] + "\\n" + message if key in errors else message

    def at(key: str) -> str:
        return "%s.%s" % (path, key) if path else key

    for key, prop in props.items():
        value = values.get(key)
        if value is None:
            if not prop.optional:
                add(at(key), "property is missing and it is not optional")
            continue
        message = check_value(value, prop)
        if message:
            add(at(key), message)
    for key in values:
        prop = props.get(key)
        if prop is None:
            if not additional:
                add(at(key), "property is not defined in schema and the schema does not allow additional properties")
            continue
        if prop.requires and values.get(prop.requires) is None:
            add(at(prop.requires), "missing property - '%s' requires this property" % at(key))
    return errors


def validate(values: Dict[str, ParamValue], props: Dict[str, Prop], additional: bool = False) -> Dict[str, object]:
    """Raise the 400 when any parameter fails; return the values typed (integers as int, booleans as 0/1)."""
    values = {k: [v] if isinstance(v, str) and k in props and props[k].type == "array" else v
              for k, v in values.items()}  # one value of an array parameter is an array of one
    errors = check_object(values, props, additional=additional)
    if errors:
        raise param_error(errors)
    typed: Dict[str, object] = {}
    for key, value in values.items():
        prop = props.get(key)
        typed[key] = _typed(value, prop.type if prop else "string")
    return typed


def _typed(value: ParamValue, kind: str) -> object:
    if kind == "array":
        return value
    if isinstance(value, list):
        value = "\0".join(value)
    if kind in ("integer", "boolean"):
        return int(value)
    if kind == "number":
        return float(value)
    return value


# --- formats (pve-common JSONSchema.pm register_format), each raising FormatError with PVE's text ---

def vmid_format(value: str) -> None:
    if not VMID_RE.match(value):
        raise FormatError("value does not look like a valid VM ID\n")


def node_format(value: str) -> None:
    if not NODE_RE.match(value):
        raise FormatError("value does not look like a valid node name\n")


def dns_name_format(value: str) -> None:
    if not DNS_NAME_RE.match(value):
        raise FormatError("value does not look like a valid DNS name\n")


def urlencoded_format(value: str) -> None:
    if not URLENCODED_RE.match(value):
        raise FormatError("invalid urlencoded string: %s\n" % value)


def configid_list_format(value: str) -> None:
    for item in split_list(value):
        if not CONFIGID_RE.match(item):
            raise FormatError("invalid configuration ID '%s'\n" % item)


def storage_id_format(value: str) -> None:
    if not STORAGE_ID_RE.match(value):
        raise FormatError("storage ID '%s' contains illegal characters\n" % value)


def tag_list_format(value: str) -> None:
    for tag in re.split(r"[;, ]+", value.strip()):
        if tag and not TAG_RE.match(tag):
            raise FormatError("invalid characters in tag\n")


def mac_format(value: str) -> None:
    if not MAC_RE.match(value):
        raise FormatError("value does not look like a valid unicast MAC address\n")


def ipv4_format(value: str) -> None:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise FormatError("value does not look like a valid IPv4 address\n")


def ipv6_format(value: str) -> None:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        raise FormatError("value does not look like a valid IPv6 address\n")


def cidr_format(version: int) -> Format:
    def check(value: str) -> None:
        prefix = value.partition("/")[2]
        limit = 32 if version == 4 else 128
        try:
            ipaddress.ip_interface(value)
            ok = ipaddress.ip_interface(value).version == version and prefix.isdigit() and 7 < int(prefix) <= limit
        except ValueError:
            ok = False
        if not ok:
            raise FormatError("value does not look like a valid IPv%d CIDR network\n" % version)
    return check


def address_list_format(value: str) -> None:
    for item in split_list(value):
        try:
            ipaddress.ip_address(item)
        except ValueError:
            raise FormatError("value does not look like a valid IP address\n")


def split_list(value: str) -> List[str]:
    """PVE::Tools::split_list: items separated by commas, semicolons, spaces or NUL."""
    return [item for item in re.split(r"[,;\s\0]+", value or "") if item]
