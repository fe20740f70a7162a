"""The guest agent's failures, which PVE reports as HTTP 500 like many others, typed for the callers."""

import pytest

from ansible_collections.llmgw.fleet.plugins.module_utils import proxmox_errors as errors


@pytest.mark.parametrize("reason, cls", [
    ("No QEMU guest agent configured", errors.AgentNotConfigured),
    ("VM 1105 is not running", errors.VMNotRunning),
    ("VM 1105 not running", errors.VMNotRunning),
    ("QEMU guest agent is not running", errors.AgentNotRunning),
])
def test_agent_failures_get_their_own_types(reason, cls):
    typed = errors.classify_agent(errors.classify(500, reason))
    assert typed.__class__ is cls and issubclass(cls, errors.ProxmoxError)
    assert (typed.status, typed.reason) == (500, reason) and reason in str(typed)


@pytest.mark.parametrize("status, reason", [
    (500, "Agent error: Guest agent command failed, error was 'Failed to execute child process'"),
    (500, "Configuration file 'nodes/pve/qemu-server/1105.conf' does not exist"),
    (401, "authentication failure"),
])
def test_other_failures_are_left_as_they_were(status, reason):
    error = errors.classify(status, reason)
    assert errors.classify_agent(error) is error
