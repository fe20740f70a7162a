# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why an engine binary will not start, from ``ldd`` output and from running it. Pure (text and codes in) but for
:func:`run_binary` and :func:`start_binary`, the one way the engine modules run a binary (to its end, or as a
server they talk to meanwhile).

A missing shared library is named with the Debian package that provides it (libgomp.so.1 -> libgomp1); a binary
killed by a signal is named with the signal and what it usually means here (SIGILL: an instruction this CPU, or
this VM's CPU type, does not have).
"""

from __future__ import annotations

import re
import signal
import subprocess

# Shared libraries llama.cpp's Linux builds link against, and the Debian 12 packages that ship them.
DEBIAN_PACKAGES = {
    "libgomp.so.1": "libgomp1",
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
    "libc.so.6": "libc6",
    "libm.so.6": "libc6",
    "libpthread.so.0": "libc6",
    "libdl.so.2": "libc6",
    "librt.so.1": "libc6",
    "libcurl.so.4": "libcurl4",
    "libssl.so.3": "libssl3",
    "libcrypto.so.3": "libssl3",
    "libopenblas.so.0": "libopenblas0",
    "libvulkan.so.1": "libvulkan1",
}

_NOT_FOUND_RE = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.M)
_LOADER_RE = re.compile(r"error while loading shared libraries: ([^:\s]+): cannot open shared object file")
_SIGNAL_MEANING = {
    "SIGILL": "an illegal instruction: the binary (or a library it loaded) was built for CPU features this CPU "
              "does not offer; on a VM, its CPU type hides them",
    "SIGSEGV": "a segmentation fault",
    "SIGBUS": "a bus error (often a truncated or changed file that was memory-mapped)",
    "SIGABRT": "an abort (an assertion or an uncaught exception; see its stderr)",
    "SIGKILL": "killed (the out-of-memory killer, or a timeout)",
}


def package_for(library):
    """The Debian package that provides ``library``, or None when the table does not know it."""
    return DEBIAN_PACKAGES.get(library)


def missing_libraries(ldd_output):
    """Library names ldd reports as ``not found``, in order, without repeats."""
    found = []
    for name in _NOT_FOUND_RE.findall(ldd_output or ""):
        if name not in found:
            found.append(name)
    return found


def loader_error_library(stderr):
    """The library the dynamic loader could not open, from a failed start's stderr; None if that was not why."""
    match = _LOADER_RE.search(stderr or "")
    return match.group(1) if match else None


def signal_name(returncode):
    """``-4`` (subprocess) or ``132`` (a shell's 128+N) -> ``SIGILL``; None for a normal exit."""
    if returncode is None:
        return None
    number = -returncode if returncode < 0 else (returncode - 128 if 128 < returncode < 160 else None)
    if not number:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal %d" % number


def describe_missing(library, needed_by):
    package = package_for(library)
    fix = ("install the Debian package %s (apt-get install %s)" % (package, package) if package
           else "find the package that ships it (apt-file search %s)" % library)
    return "%s needs %s, which is not installed: %s" % (needed_by, library, fix)


def describe_crash(binary, returncode):
    name = signal_name(returncode)
    if not name:
        return None
    meaning = _SIGNAL_MEANING.get(name, "a crash")
    return "%s crashed with %s: %s" % (binary, name, meaning)


def start_problems(binary, returncode, stderr, ldd_reports=None):
    """Every reason found that ``binary`` cannot run. ``ldd_reports``: {file: ldd output} for it and its libraries.

    Returns a list of {kind, library?, package?, signal?, message}.
    """
    problems, named = [], set()
    for path, output in sorted((ldd_reports or {}).items()):
        for library in missing_libraries(output):
            if (library, path) in named:
                continue
            named.add((library, path))
            problems.append({"kind": "missing_library", "library": library, "package": package_for(library),
                             "file": path, "message": describe_missing(library, path)})
    library = loader_error_library(stderr)
    if library and (library, binary) not in named:
        problems.append({"kind": "missing_library", "library": library, "package": package_for(library),
                         "file": binary, "message": describe_missing(library, binary)})
    crash = describe_crash(binary, returncode)
    if crash:
        problems.append({"kind": "crash", "signal": signal_name(returncode), "file": binary, "message": crash})
    elif returncode not in (0, None) and not library:
        tail = (stderr or "").strip().splitlines()[-3:]
        problems.append({"kind": "exit", "file": binary, "returncode": returncode,
                         "message": "%s exited with status %d: %s" % (binary, returncode, " | ".join(tail))})
    return problems


def merge_missing(problems):
    """One entry per missing library, naming every file that needs it; other problems kept as they are."""
    merged, by_library = [], {}
    for problem in problems:
        if problem.get("kind") != "missing_library":
            if problem not in merged:
                merged.append(problem)
            continue
        library = problem["library"]
        if library not in by_library:
            entry = dict(problem, files=[])
            by_library[library] = entry
            merged.append(entry)
        entry = by_library[library]
        name = problem["file"].rsplit("/", 1)[-1]
        if name not in entry["files"]:
            entry["files"].append(name)
    for library, entry in by_library.items():
        entry.pop("file", None)
        package = entry.get("package")
        fix = ("install the Debian package %s (apt-get install %s)" % (package, package) if package
               else "find the package that ships it (apt-file search %s)" % library)
        entry["message"] = "%s is not installed (needed by %s): %s" % (library, ", ".join(entry["files"]), fix)
    return merged


# How every engine binary is run: no stdin, and cwd ``/``, since llama.cpp also loads backends from the current
# directory and a stray copy there would change what is checked.
_CHILD = {"cwd": "/", "stdin": subprocess.DEVNULL}


def run_binary(argv, timeout):
    """Run one engine binary to its end the way every engine check does (I/O: the one subprocess helper of the
    engine modules, with :func:`start_binary`). ``(returncode, stdout, stderr, error)``: returncode None and error
    set when it could not start or ran past ``timeout`` seconds."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, **_CHILD)
    except subprocess.TimeoutExpired:
        return None, "", "", "timed out after %s s" % timeout
    except OSError as exc:
        return None, "", "", str(exc)
    return done.returncode, done.stdout, done.stderr, None


def start_binary(argv, log):
    """Start one engine binary that keeps running (a server the caller talks to, then stops), as :func:`run_binary`
    runs one: no stdin, cwd ``/``; stdout and stderr both go to the file object ``log``. The ``subprocess.Popen``;
    OSError when it could not start."""
    return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, **_CHILD)
