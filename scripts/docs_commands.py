"""Checks the `fovea` and `fovea-bench` command lines of the shell examples
(and of inline code spans) in the given Markdown files against the binaries' --help: the subcommand
exists, and every --flag written after it is one of its options. Synopsis
notation ([--x N], a|b, …) is allowed; a typo in a flag or a subcommand that
no longer exists is an error naming the file and line."""
import re
import subprocess
import sys

bins, files = sys.argv[1], sys.argv[2:]
helps = {}


def help_of(binary, sub):
    key = (binary, tuple(sub))
    if key not in helps:
        args = [f"{bins}/{binary}"] + sub + ["--help"]
        p = subprocess.run(args, capture_output=True, text=True)
        helps[key] = p.stdout if p.returncode == 0 else None
    return helps[key]


def commands(path):
    fence = None
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        s = line.strip()
        if s.startswith("```"):
            fence = None if fence is not None else s[3:].strip()
            continue
        if fence is None:
            # Inline code spans that are command lines: `fovea replay --lake …`.
            for span in re.findall(r"`(fovea(?:-bench)? [^`]+)`", line):
                m = re.match(r"^(fovea(?:-bench)?) (.*)$", span.strip())
                yield n, m.group(1), m.group(2)
            continue
        if fence in ("sh", "bash", "shell", "console"):
            s = re.sub(r"^\$ ", "", s)
            s = s.split(" # ")[0].split("  #")[0]
            for part in re.split(r"&&|\|\||;|\|(?= *[a-z])", s):
                part = part.strip()
                m = re.match(r"^(?:cargo run[^-]*(?:--bin (fovea)|-p (fovea-bench))[^-]*(?:-\S+ )*-- |(fovea(?:-bench)?) )(.*)$", part)
                if m:
                    binary = m.group(1) or m.group(2) or m.group(3)
                    yield n, binary, m.group(4)


errors = 0
checked = 0
for path in files:
    for n, binary, rest in commands(path):
        words = rest.split()
        if binary == "fovea" and words[:1] == ["bench"]:
            binary, words = "fovea-bench", words[1:]
        # A placeholder (`fovea …`, `fovea-bench ARGS…`) names no command.
        if words and re.match(r"^([A-Z_]+…?|…)$", words[0]):
            continue
        sub = []
        for w in words:
            if w.startswith("-") or not re.match(r"^[a-z][a-z-]*$", w):
                break
            if help_of(binary, sub + [w]) is None:
                break
            sub.append(w)
        text = help_of(binary, sub)
        if text is None or (not sub and words and not words[0].startswith("-")):
            print(f"{path}:{n}: `{binary} {' '.join(words[:1])}`: no such command")
            errors += 1
            continue
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                print(f"{path}:{n}: `{binary} {' '.join(sub)}` has no option {flag}")
                errors += 1
        checked += 1
print(f"{checked} command lines checked, {errors} errors")
sys.exit(1 if errors or checked == 0 else 0)
