#!/usr/bin/env python3
"""Keeps CI's builds incremental across fresh clones.

Cargo decides what to rebuild by comparing the modification times of a
crate's sources with its last build. Every file of a fresh clone is new, so
every workspace crate is rebuilt in every profile CI builds (tests, the
optimised model test, the Lambda functions' release build, the check of the
libFuzzer driver) though most did not change. This gives a file whose content is the
one the previous CI run built (same git blob) the modification time it had
then, so only crates whose sources changed are rebuilt.

  ci-mtimes.py save MAP               after a CI run that passed
  ci-mtimes.py restore MAP DIR...     at the start of the next (DIRs: the
                                      target directories the run builds in)

`restore` does nothing when anything was built in one of the DIRs after the
map was saved (a build from another checkout may have left artifacts of
other sources there: the old times would make Cargo take them for these).
A clone at another path than the last run's is restored like the same one:
Cargo's fingerprints of workspace crates hold paths relative to the
workspace, and the tests find their data as they run (Cargo and nextest set
`CARGO_MANIFEST_DIR` for them: `fovea_testkit::package_dir!`), not by the
directory their build saw, so binaries built in the other clone read this
one's files.
"""

import json
import os
import subprocess
import sys
import time


def tracked():
    """(path, blob id) of every file git tracks in the working directory."""
    out = subprocess.run(["git", "ls-files", "-s", "-z"], check=True, capture_output=True).stdout
    for entry in out.split(b"\0"):
        if entry:
            meta, path = entry.split(b"\t", 1)
            yield path.decode(), meta.split()[1].decode()


def newest_build(dirs):
    """The newest modification time (ns) of Cargo's fingerprints in dirs."""
    newest = 0
    for root in dirs:
        if not os.path.isdir(root):
            continue
        for top, subdirs, files in os.walk(root):
            depth = top[len(root):].count(os.sep)
            if ".fingerprint" in top.split(os.sep):
                for name in files + subdirs:
                    try:
                        newest = max(newest, os.lstat(os.path.join(top, name)).st_mtime_ns)
                    except FileNotFoundError:
                        pass
            elif depth >= 3:
                subdirs[:] = []
            else:
                # Only the profile directories hold fingerprints.
                subdirs[:] = [d for d in subdirs if d not in ("deps", "build", "incremental", "doc")]
    return newest


def save(path):
    files = {}
    for name, blob in tracked():
        try:
            files[name] = [blob, os.lstat(name).st_mtime_ns]
        except FileNotFoundError:
            pass
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"saved_ns": time.time_ns(), "root": os.path.realpath("."), "files": files}, f)
    os.replace(tmp, path)
    print(f"ci-mtimes: {len(files)} files' times saved for the next run")


def restore(path, dirs):
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        print("ci-mtimes: no times saved by an earlier run: every file counts as changed")
        return
    except (OSError, ValueError) as e:
        print(f"ci-mtimes: {path} unreadable ({e}): every file counts as changed")
        return
    if not isinstance(saved, dict) or not isinstance(saved.get("saved_ns"), int) or not isinstance(saved.get("files"), dict):
        print(f"ci-mtimes: {path} is not a map this script saved: every file counts as changed")
        return
    if newest_build(dirs) > saved["saved_ns"]:
        print("ci-mtimes: something was built in the target directories after the last CI run: every file counts as changed")
        return
    same = changed = 0
    for name, blob in tracked():
        old = saved["files"].get(name)
        if old and old[0] == blob and not os.path.islink(name):
            os.utime(name, ns=(old[1], old[1]))
            same += 1
        else:
            changed += 1
    moved = "" if saved.get("root") == os.path.realpath(".") else f" (in a clone at {saved.get('root')})"
    print(f"ci-mtimes: {same} files as the last CI run built them{moved}, {changed} changed or new")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "save":
        save(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "restore":
        restore(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
