"""What a job on Slurm needs before Slurm may start it: ``python -m deeppod.executor.slurm_prepare
JOB_DIR``, started as root by the Slurm executor for a job with its own Python environment.

It builds the environment (or finds it built) as any node's supervisor does: once per key, as the
tenant's identity in a sandbox, on this host, into the environments folder on the shared file
system; its output goes to the first worker's log and its phase reads "preparing environment".
Then it lets the job's identity cross the server's folders to it, and submits the job with the
``sbatch`` line the executor wrote (``slurm-submit.json``), writing Slurm's job id for the
executor to read. A stop asked meanwhile (the job folder's ``stop``, or SIGTERM) ends it before
anything is submitted, or cancels what it just submitted; a build that fails ends the run with
the installer's own words, as on any node.

Standard library only, as the supervisor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from deeppod.envs import build as envs
from deeppod.envs import images
from deeppod.job_folder import JobFolder
from deeppod.posix_acl import grant_cross


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m deeppod.executor.slurm_prepare JOB_DIR", file=sys.stderr)
        return 2
    folder = JobFolder(Path(argv[1]))
    spec = folder.read_spec()
    submit = json.loads(folder.slurm_submit().read_text())
    asked: list[int] = []  # the executor's terminate(): no submit after the build
    signal.signal(signal.SIGTERM, lambda sig, _: asked.append(sig))
    ranks = [int(w["rank"]) for w in spec["workers"]]
    # the server on Slurm makes its files private (umask 077); the build's sandbox, as on any node,
    # makes the folders its root is mounted on for the tenant's identity to cross
    os.umask(0o022)
    folder.write_phase("preparing environment")
    try:
        with open(folder.log(min(ranks)), "ab", buffering=0) as log:
            if spec["env"].get("image"):  # unpacked as on any node, for the tasks to enter
                path = images.ensure(spec["env"], log)
            else:
                path = envs.ensure(spec["env"], log, spec.get("sandbox"))
        if (spec.get("sandbox") or {}).get("uid") is not None:
            grant_cross(path, int(spec["sandbox"]["uid"]))
    except (envs.BuildError, OSError) as exc:
        return _ended(folder, ranks, f"could not unpack its image: {exc}" if spec["env"].get("image")
                      else f"could not build its Python environment: {exc}")
    finally:
        folder.write_phase(None)
    if asked or folder.read_stop() is not None:
        folder.write_result({"exit_codes": {}, "reason": "", "stopped": folder.read_stop() == "stop"})
        return 0
    done = subprocess.run(submit["argv"], capture_output=True, text=True, env={**os.environ, **submit["env"]})
    if done.returncode != 0:
        return _ended(folder, ranks, f"sbatch failed: {done.stderr.strip() or done.stdout.strip()}")
    slurm_id = done.stdout.strip().split(";")[0]
    folder.write_slurm_id(slurm_id)
    if asked or folder.read_stop() is not None:  # a stop that came while it submitted: nothing runs
        subprocess.run(["scancel", slurm_id], capture_output=True, env={**os.environ, **submit["env"]})
    return 0


def _ended(folder: JobFolder, ranks: list[int], reason: str) -> int:
    folder.write_result({"exit_codes": {str(r): 1 for r in ranks}, "reason": reason})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
