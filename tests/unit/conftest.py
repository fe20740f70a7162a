"""Unit tests under ansible-test units (which runs pytest with -n auto) and under plain pytest alike."""


def pytest_xdist_make_scheduler(config, log):
    """Hand out whole test modules, not single tests: some modules are a sequence over one registry file
    (test_fleet_modules.py's test_1 .. test_8), which only holds when one worker runs them in order."""
    from xdist.scheduler import LoadScopeScheduling

    return LoadScopeScheduling(config, log)
