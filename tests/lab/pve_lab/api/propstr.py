"""Property strings (`virtio=BC:24:11:..,bridge=vmbr0`), parsed and printed as pve-common does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

from pve_lab.api.schema import FormatError, Prop, check_object

TRUE_WORDS = ("1", "on", "yes", "true")
FALSE_WORDS = ("0", "off", "no", "false")


@dataclass(frozen=True)
class PropString:
    """A hash-based format: its keys, the key a bare value belongs to, and aliases like `virtio=MAC`."""

    keys: Dict[str, Prop]
    default_key: Optional[str] = None
    aliases: Dict[str, str] = field(default_factory=dict)  # alias -> key it stores its value under
    key_alias: Optional[str] = None  # key that remembers which alias was used (net's `model`)
    validator: Optional[Callable[[Dict[str, str]], None]] = None

    def parse(self, value: str, path: str = "") -> Dict[str, str]:
        """parse_property_string; errors raise FormatError with PVE's text ("format error" + one line each)."""
        result: Dict[str, str] = {}
        for part in value.split(","):
            if not part.strip():
                continue
            key, sep, item = part.partition("=")
            if sep and key and item:
                if key in result:
                    raise FormatError("duplicate key in comma-separated list property: %s\n" % key)
                if key in self.aliases:
                    if self.key_alias:
                        if self.key_alias in result:
                            raise FormatError("key alias '%s' is already defined\n" % self.key_alias)
                        result[self.key_alias] = key
                    key = self.aliases[key]
                prop = self.keys.get(key)
                if prop is None:
                    raise FormatError("invalid key in comma-separated list property: %s\n" % key)
                if prop.type == "boolean":
                    item = _boolean(item)
                result[key] = item
            elif not sep:
                if self.default_key is None:
                    raise FormatError("value without key, but schema does not define a default key\n")
                if self.default_key in result:
                    raise FormatError("duplicate key in comma-separated list property: %s\n" % self.default_key)
                result[self.default_key] = part
            else:
                raise FormatError("missing key in comma-separated list property\n")
        errors = check_object(result, self.keys, path=path)
        if errors:
            raise FormatError("format error\n" + "".join("%s: %s\n" % item for item in sorted(errors.items())))
        if self.validator is not None:
            self.validator(result)
        return result

    def check(self, path: str) -> Callable[[str], None]:
        """This format as a parameter format (what `format => $fmt` does in a schema)."""
        return lambda value: self.parse(value, path)

    def render(self, values: Dict[str, str]) -> str:
        """print_property_string: the default key (or `alias=value`) first, then the rest in key order."""
        parts = []
        rest = dict(values)
        if self.key_alias and self.key_alias in rest and self.aliases.get(rest[self.key_alias]) in rest:
            alias = rest.pop(self.key_alias)
            parts.append("%s=%s" % (alias, rest.pop(self.aliases[alias])))
        elif self.default_key and self.default_key in rest:
            parts.append(rest.pop(self.default_key))
        parts.extend("%s=%s" % (key, rest[key]) for key in sorted(rest))
        return ",".join(parts)


def _boolean(value: str) -> str:
    lowered = value.lower()
    if lowered in TRUE_WORDS:
        return "1"
    if lowered in FALSE_WORDS:
        return "0"
    return value
