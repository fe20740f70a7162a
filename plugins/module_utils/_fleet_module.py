# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the fleet_* modules that write the registry repeat: open it for the task (in check mode an in-memory copy,
so check mode runs the very same checks and writes nothing), run the service, map the registry's and the solver's
errors to ``fail_json`` (with ``db``), and close it. Private to the modules."""

from __future__ import annotations

from typing import Callable, Tuple, Type, TypeVar

from ansible_collections.llmgw.fleet.plugins.module_utils import fleet_registry, placement

T = TypeVar("T")
ERRORS: Tuple[Type[Exception], ...] = (fleet_registry.RegistryError, placement.PlacementError)


def run(module, work: Callable[[fleet_registry.FleetRegistry], T],
        errors: Tuple[Type[Exception], ...] = ERRORS, create: bool = True) -> Tuple[str, T]:
    """``work(registry)`` on the registry of the module's ``db`` option (created when missing, unless ``create`` is
    False). Returns (the registry's path, what ``work`` returned); fails the module on a registry error or one of
    ``errors``."""
    try:
        registry = fleet_registry.open_for_module(module.params["db"], module.check_mode, create=create)
    except fleet_registry.RegistryError as exc:
        module.fail_json(msg=str(exc))
    try:
        return registry.path, work(registry)
    except errors as exc:
        module.fail_json(msg=str(exc), db=registry.path)
    finally:
        registry.close()
