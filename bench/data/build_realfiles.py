#!/usr/bin/env python3
"""Build a set of real, healthy text files of the kinds that LLMs write.

Python 3.11, standard library only.  Collects pieces of files installed on
this machine (Debian bookworm + pyenv + Node/npm + google-cloud-sdk + a local
wheel mirror for a few scarce kinds) and writes

    bench/data/realfiles.jsonl.gz   (beside this script)

with one JSON row per piece: {"id", "kind", "group", "source", "sha256", "text"}.

Deterministic: file lists are sorted, then sampled with random.Random(20261202)
(one derived generator per kind, in a fixed kind order).  See REALFILES.md.  It was
written, and the set built, by a hand that had not read the detector it measures.  The
shipped file is the one built on the machine the project's figures were taken on: another
machine with other packages installed builds another set.
"""

import collections
import concurrent.futures
import gzip
import hashlib
import io
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import zipfile
import zlib

SEED = 20261202
OUT_DIR = os.path.dirname(os.path.abspath(__file__))
OUT_FILE = os.path.join(OUT_DIR, "realfiles.jsonl.gz")
MAX_GZ_BYTES = 8 * 1000 * 1000

MIN_CHARS = 1500
MAX_CHARS = 20000
MAX_PIECES_PER_FILE = 3
MAX_PER_PACKAGE = 40
MAX_PER_DIR = 40
MAX_RAW_BYTES = 6 * 1024 * 1024

PYVER = "/root/.pyenv/versions/3.11.7"
PYLIB = PYVER + "/lib/python3.11"
SITE = PYLIB + "/site-packages"
GCLOUD = "/usr/lib/google-cloud-sdk"
RUSTDOC = "/root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc"

# Directory trees walked (sorted, symlinks not followed).
ROOTS = [
    "/root/.pyenv",
    "/usr/share",
    "/usr/include",
    "/usr/lib/python3",
    "/usr/lib/node_modules",
    GCLOUD,
    "/usr/lib/git-core",
    "/usr/lib/perf-core",
    "/usr/lib/x86_64-linux-gnu/perl",
    "/usr/lib/x86_64-linux-gnu/perl5",
    "/usr/lib/x86_64-linux-gnu/perl-base",
    "/usr/lib/llvm-14",
    "/usr/lib/jvm",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/cuda-13.0/include",
    RUSTDOC,
]
# Single files (port / protocol / MIME tables, the dpkg database, Rust release notes).
EXTRA_FILES = [
    "/etc/services",
    "/etc/protocols",
    "/etc/mime.types",
    "/etc/ethertypes",
    "/var/lib/dpkg/status",
    "/root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc/rust/html/releases.md",
]
# Local wheel mirror: only used for kinds that are scarce among installed files.
WHEEL_DIRS = ["/opt/pypi/files", "/opt/pypi-more/files"]
WHEEL_KINDS = {
    "csv",
    "tsv",
    "typescript-d",
    "typescript",
    "toml",
    "yaml",
    "sql",
    "go",
    "rust",
    "cpp-source",
    "requirements",
    "dockerfile",
}

# Never look inside these (project checkout, project caches, sandbox machinery,
# copies of other things, binary-only trees).
PRUNE_PREFIXES = (
    "/work",
    "/farm",
    "/opt/skills",
    "/root/.cache",
    "/proc",
    "/sys",
    "/root/.pyenv/versions/2.",
    "/root/.pyenv/versions/3.6",
    "/root/.pyenv/versions/3.7",
    "/root/.pyenv/versions/3.8",
    "/root/.pyenv/versions/3.9",
    "/root/.pyenv/versions/3.10",
    "/root/.pyenv/versions/3.12",
    "/root/.pyenv/versions/3.13",
    "/root/.pyenv/shims",
    "/root/.pyenv/cache",
    "/root/.pyenv/sources",
    GCLOUD + "/platform/bundledpythonunix",
    "/usr/share/package-lists",  # not from any Debian package: environment setup lists
    "/usr/share/locale",
    "/usr/share/icons",
    "/usr/share/fonts",
    "/usr/share/pixmaps",
    "/usr/share/themes",
    "/usr/share/sounds",
    "/usr/share/zoneinfo/posix",
    "/usr/share/zoneinfo/right",
    RUSTDOC + "/rust/html",
)
PRUNE_NAMES = {"__pycache__", ".git", ".hg", ".svn", ".cache"}
BAD_NAME_RE = re.compile(r"coherence|sandboxing|egress", re.I)

BINARY_EXTS = {
    "pyc",
    "pyo",
    "so",
    "a",
    "o",
    "png",
    "gif",
    "jpg",
    "jpeg",
    "ico",
    "bmp",
    "tif",
    "tiff",
    "webp",
    "svgz",
    "mo",
    "whl",
    "jar",
    "zip",
    "tgz",
    "bz2",
    "xz",
    "zst",
    "lz4",
    "7z",
    "ttf",
    "otf",
    "woff",
    "woff2",
    "eot",
    "pfb",
    "pdf",
    "npz",
    "npy",
    "pkl",
    "pickle",
    "mgc",
    "db",
    "sqlite",
    "sqlite3",
    "wav",
    "mp3",
    "ogg",
    "flac",
    "mat",
    "sav",
    "nc",
    "h5",
    "hdf5",
    "dat.gz",
    "bin",
    "exe",
    "dll",
    "dylib",
    "class",
    "marisa",
    "br",
    "brotli",
    "map",
    "pem",
    "crt",
    "key",
    "der",
    "p12",
    "pfx",
    "jks",
    "keystore",
    "cer",
    "csr",
    "gpg",
    "asc",
    "sig",
    "kbx",
    "dafsa",
    "bki",
    "wasm",
    "node",
    "dic",
    "aff",
    "cache",
    "ipynb",
    "svg",
}
TEXT_EXTS_FOR_DOCS = {"", "txt", "md", "markdown", "rst", "gz", "text", "debian"}
CODE_EXTS = {
    "py",
    "pyi",
    "c",
    "h",
    "cc",
    "cpp",
    "cxx",
    "hpp",
    "hh",
    "hxx",
    "tcc",
    "js",
    "mjs",
    "cjs",
    "ts",
    "sh",
    "bash",
    "pl",
    "pm",
    "vim",
    "cmake",
    "tcl",
    "go",
    "rs",
    "sql",
    "proto",
    "css",
    "less",
    "html",
    "htm",
    "json",
    "yaml",
    "yml",
    "toml",
    "ini",
    "cfg",
    "conf",
    "xml",
    "csv",
    "tsv",
    "el",
    "awk",
    "lua",
    "in",
    "pod",
}

# ----------------------------------------------------------------------------
# Targets (pieces per kind).  Group is fixed per kind.
# ----------------------------------------------------------------------------
KINDS = [
    # (kind, group, target)
    # --- structured (processed first where they compete for the same files)
    ("enum-table", "structured", 40),
    ("licence", "structured", 70),
    ("debian-copyright", "structured", 50),
    ("debian-changelog", "structured", 45),
    ("changelog", "structured", 55),
    ("authors-list", "structured", 10),
    ("csv", "structured", 50),
    ("tsv", "structured", 25),
    ("yaml", "structured", 45),
    ("json", "structured", 50),
    ("toml", "structured", 20),
    ("ini", "structured", 35),
    ("xml", "structured", 30),
    ("test-vectors", "structured", 35),
    ("locale-table", "structured", 40),
    ("system-table", "structured", 15),
    ("requirements", "structured", 12),
    ("sql-schema", "structured", 8),
    ("pkg-metadata", "structured", 20),
    ("debian-control", "structured", 3),
    # --- code
    ("python-test-tables", "code", 100),
    ("python-tests", "code", 170),
    ("python-stdlib", "code", 200),
    ("python-package", "code", 240),
    ("python-stub", "code", 70),
    ("c-source", "code", 120),
    ("c-header", "code", 180),
    ("cpp-header", "code", 70),
    ("cpp-source", "code", 10),
    ("javascript", "code", 150),
    ("typescript-d", "code", 50),
    ("typescript", "code", 5),
    ("shell", "code", 130),
    ("perl", "code", 100),
    ("vimscript", "code", 25),
    ("cmake", "code", 40),
    ("tcl", "code", 30),
    ("go", "code", 15),
    ("rust", "code", 5),
    ("sql", "code", 70),
    ("proto", "code", 40),
    ("makefile", "code", 25),
    ("css", "code", 30),
    ("html", "code", 40),
    ("dockerfile", "code", 10),
    ("other-script", "code", 10),
    # --- prose
    ("man-page", "prose", 270),
    ("readme", "prose", 140),
    ("docs-markdown", "prose", 120),
    ("docs-rst", "prose", 120),
    ("changelog-prose", "prose", 60),
    ("vim-help", "prose", 15),
    ("info-manual", "prose", 30),
    ("perl-pod", "prose", 10),
    ("docs-text", "prose", 80),
]
KIND_GROUP = {k: g for k, g, _ in KINDS}
GROUP_ORDER = {"code": 0, "prose": 1, "structured": 2}

# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def split_ext(name):
    """Return (base_lower, ext_lower, gz) where ext excludes a trailing .gz."""
    n = name.lower()
    gz = False
    if n.endswith(".gz"):
        gz = True
        n = n[:-3]
    if n.endswith(".d.ts"):
        return n, "d.ts", gz
    if n.endswith(".conf.sample"):
        return n, "conf", gz
    i = n.rfind(".")
    if i <= 0:
        return n, "", gz
    return n, n[i + 1 :], gz


def is_testish_py(path):
    name = os.path.basename(path)
    if (
        name.startswith("test_")
        or name.endswith("_test.py")
        or name == "tests.py"
        or name == "conftest.py"
    ):
        return True
    parts = path.split("/")
    return any(p in ("test", "tests", "testing", "idle_test", "unittests") for p in parts[:-1])


SCRIPT_DIRS = (
    "/usr/bin/",
    "/usr/sbin/",
    "/usr/lib/git-core/",
    "/root/.pyenv/libexec/",
    "/root/.pyenv/bin/",
    "/root/.pyenv/plugins/",
    "/usr/lib/perf-core/",
    "/usr/share/debhelper/",
    "/usr/share/doc/",
)


def shebang_kind(path):
    try:
        with open(path, "rb") as f:
            head = f.read(128)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head.split(b"\n", 1)[0].decode("latin-1")
    if re.search(r"\b(ba|da|z|k)?sh\b", line):
        return "shell"
    if "perl" in line:
        return "perl"
    if "python" in line:
        return "python-package"
    if "tclsh" in line or "wish" in line:
        return "tcl"
    if "awk" in line:
        return "other-script"
    return None


ENCODING_TABLE_RE = re.compile(
    r"/encodings/(cp\d+|mac_\w+|iso8859_\d+|koi8_\w+|hp_roman8|kz1048|ptcp154|tis_620|palmos|"
    r"charmap|latin_1)\.py$"
)


def classify(path):
    """Map a file path to a kind, or None.  Path-only (plus shebang for scripts)."""
    if BAD_NAME_RE.search(path):
        return None
    name = os.path.basename(path)
    base, ext, gz = split_ext(name)
    nl = name.lower()
    if ext in BINARY_EXTS or nl.endswith((".min.js", ".min.css", ".pth")):
        return None
    if gz and not (path.startswith("/usr/share/") or path.startswith(PYVER + "/share/man/")):
        return None
    if gz and ext in ("tgz", "tar"):
        return None
    up = base.upper()

    # ---- man / info / vim help
    if re.search(r"/man/man[1-9][^/]*/[^/]+$", path):
        return "man-page"
    if path.startswith("/usr/share/info/") and ".info" in nl:
        return "info-manual"
    if path.startswith("/usr/share/vim/") and "/doc/" in path and ext == "txt":
        return "vim-help"

    # ---- Debian packaging docs
    if path.startswith("/usr/share/doc/"):
        if base.startswith("changelog.debian"):
            return "debian-changelog"
        if base == "copyright" and path.count("/") == 5:
            return "debian-copyright"
        if base.startswith("news.debian"):
            return "changelog-prose"
        if "/git/relnotes/" in path.lower():
            return "changelog-prose"

    # ---- licences
    if path.startswith("/usr/share/common-licenses/"):
        return "licence"
    if ext in TEXT_EXTS_FOR_DOCS or ext not in CODE_EXTS:
        if up.startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE", "COPYRIGHT")):
            return "licence"
        if ("/licenses/" in path or "/legal/" in path) and ext in ("", "txt", "md", "rst"):
            return "licence"
        if up.startswith(("CHANGES", "CHANGELOG", "HISTORY", "RELEASE_NOTES", "RELEASES")):
            return "changelog"
        if up.startswith("NEWS"):
            return "changelog-prose"
        if up.startswith("README"):
            return "readme"
        if up.startswith(("AUTHORS", "THANKS", "CONTRIBUTORS", "CREDITS", "MAINTAINERS", "ACKS")):
            return "authors-list"
        if up in ("FAQ", "TODO", "BUGS", "HACKING", "INSTALL", "FAQ.TXT", "TODO.TXT"):
            return "docs-text"
    if base in ("metadata", "pkg-info") and (".dist-info/" in path or ".egg-info" in path):
        return "pkg-metadata"

    # ---- requirements / lock files
    if (
        re.match(r"^(dev-|test-|docs?-)?requirements[\w.-]*\.(txt|in)$", base)
        or re.match(r"^constraints[\w.-]*\.txt$", base)
        or base
        in (
            "package-lock.json",
            ".package-lock.json",
            "pipfile",
            "pipfile.lock",
            "poetry.lock",
            "yarn.lock",
            "cargo.lock",
            "vendor.txt",
            "uv.lock",
            "npm-shrinkwrap.json",
        )
        or ext == "lock"
    ):
        return "requirements"

    # ---- tables
    if path.startswith("/usr/share/i18n/") or path.startswith("/usr/share/X11/locale/"):
        return "locale-table"
    if ENCODING_TABLE_RE.search(path) and path.startswith(PYLIB + "/encodings/"):
        return "locale-table"
    if "/msgs/" in path and ext == "msg":
        return "locale-table"
    if (
        path in ("/etc/services", "/etc/protocols", "/etc/mime.types", "/etc/ethertypes")
        or path.startswith("/usr/share/publicsuffix/")
        or path.startswith("/usr/share/postgresql/15/timezonesets/")
        or path.startswith("/usr/share/postgresql/15/tsearch_data/")
        or path
        in ("/usr/share/postgresql/15/errcodes.txt", "/usr/share/postgresql/15/sql_features.txt")
        or path.startswith("/usr/share/misc/")
        or path.startswith("/usr/share/distro-info/")
    ):
        return "system-table"
    if path == "/var/lib/dpkg/status":
        return "debian-control"
    if ext == "dectest":
        return "test-vectors"
    if ext in ("txt", "dat", "") and re.search(
        r"/(tests?/data|testdata|test_data|data/tests?)/", path
    ):
        return "test-vectors"
    if ext == "txt" and path.startswith(PYLIB + "/test/") and path.count("/") <= 8:
        return "test-vectors"

    # ---- code by extension
    if ext == "py":
        if is_testish_py(path):
            return "python-tests"
        if path.startswith(PYLIB + "/") and not path.startswith(SITE + "/"):
            return "python-stdlib"
        return "python-package"
    if ext == "pyi":
        return "python-stub"
    if ext == "c":
        return "c-source"
    if ext in ("cc", "cpp", "cxx", "cu"):
        return "cpp-source"
    if ext == "h":
        return "cpp-header" if "/include/c++/" in path else "c-header"
    if ext in ("hpp", "hh", "hxx", "tcc", "cuh", "inl"):
        return "cpp-header"
    if ext == "" and path.startswith("/usr/include/c++/"):
        return "cpp-header"
    if ext == "d.ts":
        return "typescript-d"
    if nl.endswith((".d.mts", ".d.cts")):
        return "typescript-d"
    if ext in ("ts", "tsx", "mts", "cts"):
        return "typescript"
    if ext in ("js", "mjs", "cjs"):
        return "javascript"
    if ext in ("sh", "bash", "zsh", "bats"):
        return "shell"
    if path.startswith("/usr/share/bash-completion/completions/"):
        return "shell"
    if ext in ("pl", "pm"):
        return "perl"
    if ext == "vim":
        return "vimscript"
    if ext == "cmake" or base == "cmakelists.txt":
        return "cmake"
    if ext in ("tcl", "tk"):
        return "tcl"
    if ext == "go":
        return "go"
    if ext == "rs":
        return "rust"
    if ext == "sql":
        if path.startswith("/usr/share/postgresql/15/") and "/extension/" not in path:
            return "sql-schema"
        return "sql"
    if ext == "proto":
        return "proto"
    if base in ("makefile", "gnumakefile") or ext == "mk" or base.startswith("makefile."):
        return "makefile"
    if ext in ("css", "less", "scss"):
        return "css"
    if ext in ("html", "htm", "xhtml"):
        return "html"
    if base.startswith("dockerfile") and ext not in CODE_EXTS:
        return "dockerfile"
    if ext in ("awk", "sed", "el", "lua"):
        return "other-script"

    # ---- structured by extension
    if ext == "csv":
        return "csv"
    if ext in ("tsv", "tab"):
        return "tsv"
    if ext in ("json", "jsonc", "geojson", "json5"):
        return "json"
    if ext in ("yaml", "yml"):
        return "yaml"
    if ext == "toml":
        return "toml"
    if ext in ("ini", "cfg", "conf", "properties", "editorconfig", "flake8", "pylintrc"):
        return "ini"
    if ext in ("xml", "pom", "xsd", "xsl", "xslt", "rng", "wsdl", "plist"):
        return "xml"

    # ---- prose by extension
    if ext == "rst":
        return "docs-rst"
    if ext in ("md", "markdown"):
        return "docs-markdown"
    if ext == "pod":
        return "perl-pod"
    if ext in ("adoc", "asciidoc"):
        return "docs-text"
    if (
        path.startswith("/usr/share/doc/")
        and ext in ("txt", "text", "")
        and "/examples/" not in path
        and not base.startswith(("test_results", "status", "langcover", "unicover", "gdbinit"))
    ):
        sk = shebang_kind(path) if ext == "" and not gz else None
        return sk or "docs-text"

    # ---- extension-less scripts
    if ext == "" and path.startswith(SCRIPT_DIRS):
        return shebang_kind(path)
    return None


# ----------------------------------------------------------------------------
# Package keys (for the per-package cap)
# ----------------------------------------------------------------------------


def load_dpkg_map():
    owner = {}
    d = "/var/lib/dpkg/info"
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return owner
    for fn in names:
        if not fn.endswith(".list"):
            continue
        pkg = fn[:-5].split(":")[0]
        try:
            with open(os.path.join(d, fn), encoding="utf-8", errors="replace") as f:
                for line in f:
                    p = line.rstrip("\n")
                    if p and p not in owner:
                        owner[p] = pkg
        except OSError:
            pass
    return owner


DPKG = {}


PG_EXT = "/usr/share/postgresql/15/extension/"


def pkg_key(path):
    if path.startswith(PG_EXT):
        # each PostgreSQL contrib extension is its own module
        return "pg-ext:" + os.path.basename(path).split("--")[0].split(".")[0]
    if path.startswith("wheel:"):
        whl = path[6:].split("!", 1)[0]
        return "wheel:" + os.path.basename(whl).split("-")[0].lower()
    if path.startswith(SITE + "/"):
        top = path[len(SITE) + 1 :].split("/")[0]
        top = re.sub(r"-\d.*$", "", top)
        top = re.sub(r"\.(py|pyi)$", "", top)
        return "site:" + top.lower().replace("-", "_")
    if path.startswith(PYLIB + "/"):
        parts = path[len(PYLIB) + 1 :].split("/")
        if len(parts) == 1:
            return "stdlib:/"
        if (
            parts[0]
            in (
                "test",
                "idlelib",
                "lib2to3",
                "tkinter",
                "unittest",
                "ctypes",
                "distutils",
                "email",
                "importlib",
            )
            and len(parts) > 2
        ):
            return "stdlib:" + parts[0] + "/" + parts[1]
        return "stdlib:" + parts[0]
    if "/node_modules/" in path:
        rest = path.rsplit("/node_modules/", 1)[1].split("/")
        name = rest[0] + ("/" + rest[1] if rest[0].startswith("@") and len(rest) > 1 else "")
        return "npm:" + name
    if path.startswith(GCLOUD + "/"):
        parts = path[len(GCLOUD) + 1 :].split("/")
        if "third_party" in parts[:-1]:
            i = parts.index("third_party")
            return "gcloud:" + "/".join(parts[: i + 2])
        return "gcloud:" + "/".join(parts[: min(3, len(parts) - 1)])
    if path.startswith(PYVER + "/"):
        return "pyenv-3.11:" + path[len(PYVER) + 1 :].split("/")[0]
    if path.startswith("/root/.pyenv/"):
        parts = path[len("/root/.pyenv/") :].split("/")
        return "pyenv:" + "/".join(
            parts[: 2 if parts[0] == "plugins" else 1][: len(parts) - 1] or ["/"]
        )
    if path.startswith("/usr/local/cuda-13.0/include/"):
        parts = path[len("/usr/local/cuda-13.0/include/") :].split("/")
        return "cuda:" + (parts[0] if len(parts) > 1 else "/")
    if path.startswith("/root/.rustup/"):
        return "rustup-doc"
    pkg = DPKG.get(path)
    if pkg:
        return "deb:" + pkg
    return "dir:" + os.path.dirname(path)


def dir_key(path):
    if path.startswith(PG_EXT):
        return pkg_key(path)
    if path.startswith("wheel:"):
        whl, member = path[6:].split("!", 1)
        return "wheel:" + os.path.basename(whl) + "!" + os.path.dirname(member)
    return os.path.dirname(path)


# ----------------------------------------------------------------------------
# Loading and validation
# ----------------------------------------------------------------------------

_ZIPS = {}


def read_bytes(path):
    if path.startswith("wheel:"):
        whl, member = path[6:].split("!", 1)
        z = _ZIPS.get(whl)
        if z is None:
            z = _ZIPS[whl] = zipfile.ZipFile(whl)
        info = z.getinfo(member)
        if info.file_size > MAX_RAW_BYTES:
            return None
        return z.read(member)
    try:
        st = os.stat(path)
        if st.st_size > MAX_RAW_BYTES:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if path.endswith(".gz"):
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as g:
                data = g.read(MAX_RAW_BYTES + 1)
        except (OSError, EOFError, zlib.error):
            return None
        if len(data) > MAX_RAW_BYTES:
            return None
    return data


MAN_ENV = dict(
    os.environ, MANWIDTH="80", LANG="C.UTF-8", LC_ALL="C.UTF-8", MANPAGER="cat", PAGER="cat"
)
MAN_ENV.pop("MAN_KEEP_FORMATTING", None)


def render_man(path):
    try:
        r = subprocess.run(
            ["man", "--nj", "--nh", "-P", "cat", "-l", path],
            capture_output=True,
            env=MAN_ENV,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    # Drop the running header and footer lines ("TAR(1)   GNU TAR Manual   TAR(1)"):
    # they are page furniture, and man overprints them when the title is long.
    lines = r.stdout.decode("utf-8", "replace").split("\n")
    idx = [i for i, line in enumerate(lines) if line.strip()]
    if idx and re.search(r"\(\w+\)\s*$", lines[idx[0]]):
        lines[idx[0]] = None
    if len(idx) > 1 and re.search(r"\(\w+\)\s*$", lines[idx[-1]]):
        lines[idx[-1]] = None
    text = "\n".join(line for line in lines if line is not None).strip("\n") + "\n"
    return text.encode("utf-8")


INFO_INDEX_RE = re.compile(r"\x00\x08\[[^\x00]*\x00\x08\]")
MOJIBAKE_RE = re.compile(r"Ã[\u0080-\u00bf]|â€|Â[\u00a0-\u00bf]|ï»¿|Ð[\u0080-\u00bf]Ð")
BAD_CTRL_RE = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
BLOB_LINE_RE = re.compile(
    r"^\s*(?:[A-Za-z0-9+/]{40,}={0,2}|(?:0x)?[0-9A-Fa-f]{32,}|"
    r"(?:(?:0x|\\x)?[0-9A-Fa-f]{2,8}(?:[,\s]+|$)){8,}|(?:\d{1,3},\s*){16,}\d*)[,;\"']*\s*$"
)


def decode_text(raw, path):
    """Bytes -> clean str, or None if not clean UTF-8 text."""
    if raw is None or len(raw) < MIN_CHARS // 2:
        return None
    if path.startswith("/usr/share/info/"):
        t = INFO_INDEX_RE.sub("", raw.decode("latin-1"))
        t = re.sub(r"\x1f\n(Tag Table|Indirect):.*?(?=\x1f|$)", "", t, flags=re.S)
        raw = t.replace("\x1f\nEnd Tag Table", "").replace("\x1f", "").encode("latin-1")
    if b"\x00" in raw[:8192] or b"\x00" in raw:
        return None
    try:
        t = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if t.startswith("\ufeff"):
        t = t[1:]
    t = t.replace("\r\n", "\n")
    if "\r" in t or "\ufffd" in t:
        return None
    if BAD_CTRL_RE.search(t):
        return None
    if MOJIBAKE_RE.search(t):
        return None
    if "PRIVATE KEY-----" in t:
        return None
    if "Generated by Cython" in t[:1000]:
        return None
    return t


def piece_ok(text, group):
    if len(text) < MIN_CHARS or len(text) > MAX_CHARS:
        return False
    if not text.strip():
        return False
    lines = text.split("\n")
    maxline = 4000 if group == "prose" else 1000
    if max(len(x) for x in lines) > maxline:
        return False
    blob = sum(len(x) for x in lines if len(x) >= 40 and BLOB_LINE_RE.match(x))
    if blob > 0.3 * len(text):
        return False
    # Must look like text: printable share.
    nonspace = sum(1 for c in text if not c.isspace())
    return not (nonspace < 0.3 * len(text) and group != "structured")


def make_slices(text, rng):
    n = len(text)
    if n < MIN_CHARS:
        return []
    if n <= MAX_CHARS:
        return [(0, n)]
    k = min(MAX_PIECES_PER_FILE, 1 + n // 40000)
    seg = n // k
    out = []
    for i in range(k):
        a0 = i * seg
        a1 = n if i == k - 1 else (i + 1) * seg
        L = min(rng.randint(2500, 15000), a1 - a0)
        start = rng.randint(a0, a1 - L)
        if start > 0 and text[start - 1] != "\n":
            nl = text.find("\n", start)
            if nl == -1:
                continue
            start = nl + 1
        end = min(start + L, a1)
        if end < n:
            nl = text.rfind("\n", start, end)
            if nl <= start:
                continue
            end = nl + 1
        if end - start >= MIN_CHARS:
            out.append((start, end))
    return out


def norm_hash(text):
    return hashlib.sha256(re.sub(r"\s+", " ", text).strip().lower().encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------
# Content-based kinds
# ----------------------------------------------------------------------------

ENUM_LINE_RE = re.compile(
    r"^\s*(?:#\s*define\s+[A-Za-z_]\w*\s+\S.*"
    r"|[A-Z][A-Z0-9_]{2,}\s*(?:=\s*[^,;]+)?,?\s*(?:/\*.*\*/|//.*|#.*)?"
    r"|[A-Z][A-Z0-9_]{2,}\s*=\s*\S.*)$"
)
COMMENT_LINE_RE = re.compile(r"^\s*(?:/\*|\*|//|#(?!\s*define)|\*/)")


def looks_enum_table(text):
    lines = [x for x in text.split("\n") if x.strip() and not COMMENT_LINE_RE.match(x)]
    if len(lines) < 40:
        return False
    hits = sum(1 for x in lines if ENUM_LINE_RE.match(x))
    return hits >= 40 and hits >= 0.6 * len(lines)


TABLE_ROW_RE = re.compile(r"^\s*[\(\[].*[\)\]],?\s*(#.*)?$")


def looks_test_table(text):
    if "parametrize" in text or "subTest(" in text:
        return True
    return sum(1 for x in text.split("\n") if TABLE_ROW_RE.match(x)) >= 15


# ----------------------------------------------------------------------------
# Indexing
# ----------------------------------------------------------------------------


def walk_files():
    seen = set()
    for root in ROOTS:
        if not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            keep = []
            for d in sorted(dirnames):
                full = os.path.join(dirpath, d)
                if d in PRUNE_NAMES or full.startswith(PRUNE_PREFIXES) or BAD_NAME_RE.search(d):
                    continue
                if os.path.islink(full):
                    continue
                # non-English man page trees
                if os.path.basename(dirpath) == "man" and not d.startswith("man"):
                    continue
                keep.append(d)
            dirnames[:] = keep
            for fn in sorted(filenames):
                full = os.path.join(dirpath, fn)
                if full in seen or full.startswith(PRUNE_PREFIXES):
                    continue
                seen.add(full)
                if os.path.islink(full) or BAD_NAME_RE.search(fn):
                    continue
                yield full
    for f in EXTRA_FILES:
        if os.path.isfile(f) and f not in seen:
            yield f


def _version_key(v):
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"[.+-]", v))


def pick_wheels():
    """Newest wheel of each project that is not already installed in site-packages."""
    installed = set()
    for fn in os.listdir(SITE):
        if fn.endswith((".dist-info", ".egg-info")):
            installed.add(re.sub(r"-\d.*$", "", fn).lower().replace("-", "_").replace(".", "_"))
    best = {}
    for d in WHEEL_DIRS:
        if not os.path.isdir(d):
            continue
        for fn in sorted(os.listdir(d)):
            if not fn.endswith(".whl"):
                continue
            parts = fn.split("-")
            proj = parts[0].lower().replace("-", "_").replace(".", "_")
            if proj in installed:
                continue
            key = _version_key(parts[1]) if len(parts) > 1 else ()
            full = os.path.join(d, fn)
            if proj not in best or key > best[proj][0]:
                best[proj] = (key, full)
    return [best[p][1] for p in sorted(best)]


def wheel_members():
    out = []
    for full in pick_wheels():
        try:
            with zipfile.ZipFile(full) as z:
                infos = z.infolist()
        except (OSError, zipfile.BadZipFile):
            continue
        for info in infos:
            if info.is_dir() or info.file_size < MIN_CHARS or info.file_size > MAX_RAW_BYTES:
                continue
            member = info.filename
            if BAD_NAME_RE.search(member):
                continue
            base, ext, gz = split_ext(os.path.basename(member))
            if gz:
                continue
            kind = {
                "csv": "csv",
                "tsv": "tsv",
                "tab": "tsv",
                "d.ts": "typescript-d",
                "ts": "typescript",
                "toml": "toml",
                "yaml": "yaml",
                "yml": "yaml",
                "sql": "sql",
                "go": "go",
                "rs": "rust",
                "cc": "cpp-source",
                "cpp": "cpp-source",
                "cxx": "cpp-source",
                "lock": "requirements",
            }.get(ext)
            if base in (
                "yarn.lock",
                "package-lock.json",
                "pipfile.lock",
                "poetry.lock",
                "uv.lock",
            ) or re.match(r"^(dev-|test-)?requirements[\w.-]*\.txt$", base):
                kind = "requirements"
            elif base.startswith("dockerfile") and ext not in CODE_EXTS:
                kind = "dockerfile"
            if kind in WHEEL_KINDS:
                out.append((kind, "wheel:" + full + "!" + member))
    return out


# ----------------------------------------------------------------------------
# Main selection
# ----------------------------------------------------------------------------


def main():
    t0 = time.time()
    global DPKG
    DPKG = load_dpkg_map()
    log(f"dpkg map: {len(DPKG)} paths ({time.time() - t0:.1f}s)")

    cands = collections.defaultdict(list)
    nfiles = 0
    for p in walk_files():
        nfiles += 1
        k = classify(p)
        if k:
            cands[k].append(p)
            if k == "python-tests":
                cands["python-test-tables"].append(p)
            if k in ("c-header", "cpp-header") or k == "python-stdlib":
                cands["enum-table"].append(p)
    log(f"walked {nfiles} files ({time.time() - t0:.1f}s)")
    for kind, p in wheel_members():
        cands[kind].append(p)
    log(f"wheels indexed ({time.time() - t0:.1f}s)")

    master = random.Random(SEED)
    used_files = set()
    seen_hash = set()
    seen_file_hash = set()
    pkg_count = collections.Counter()
    dir_count = collections.Counter()
    rows = []
    avail = {}

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)

    for kind, group, target in KINDS:
        rng = random.Random(master.getrandbits(64))
        files = sorted(set(cands.get(kind, [])))
        avail[kind] = len(files)
        rng.shuffle(files)
        kind_pkg = collections.Counter()
        kcap = max(15, target // 8)  # one package gives at most max(15, 1/8) of a kind
        got = 0
        i = 0
        while i < len(files) and got < target:
            batch = []
            while i < len(files) and len(batch) < 32:
                p = files[i]
                i += 1
                if p in used_files:
                    continue
                pk = pkg_key(p)
                if (
                    pkg_count[pk] >= MAX_PER_PACKAGE
                    or dir_count[dir_key(p)] >= MAX_PER_DIR
                    or kind_pkg[pk] >= kcap
                ):
                    continue
                batch.append(p)
            raws = list(pool.map(render_man, batch)) if kind == "man-page" else [None] * len(batch)
            for p, raw in zip(batch, raws, strict=True):
                if got >= target:
                    break
                pk, dk = pkg_key(p), dir_key(p)
                if (
                    pkg_count[pk] >= MAX_PER_PACKAGE
                    or dir_count[dk] >= MAX_PER_DIR
                    or kind_pkg[pk] >= kcap
                ):
                    continue
                if kind != "man-page":
                    raw = read_bytes(p)
                text = decode_text(raw, p)
                if text is None or len(text) < MIN_CHARS:
                    continue
                fh = hashlib.sha256(text.encode("utf-8")).hexdigest()
                if fh in seen_file_hash:
                    continue
                if kind == "enum-table" and not looks_enum_table(text):
                    continue
                if kind == "python-test-tables" and not looks_test_table(text):
                    continue
                seen_file_hash.add(fh)
                used_files.add(p)
                took = 0
                for a, b in make_slices(text, rng):
                    if got >= target or pkg_count[pk] >= MAX_PER_PACKAGE or kind_pkg[pk] >= kcap:
                        break
                    piece = text[a:b]
                    if not piece_ok(piece, group):
                        continue
                    h = norm_hash(piece)
                    if h in seen_hash:
                        continue
                    seen_hash.add(h)
                    src = p[6:] if p.startswith("wheel:") else p
                    if kind == "man-page":
                        src = "man --nj --nh -P cat -l " + src
                    if not (a == 0 and b == len(text)):
                        src += f":{a}-{b}"
                    rows.append(
                        {
                            "kind": kind,
                            "group": group,
                            "source": src,
                            "sha256": hashlib.sha256(piece.encode("utf-8")).hexdigest(),
                            "text": piece,
                        }
                    )
                    got += 1
                    took += 1
                    pkg_count[pk] += 1
                    kind_pkg[pk] += 1
                    dir_count[dk] += 1
        seconds = time.time() - t0
        log(f"{kind:20s} {got:4d}/{target:<4d} from {avail[kind]} candidate files ({seconds:.1f}s)")
    pool.shutdown()

    # Stable order: group, kind, selection order.
    order = {k: n for n, (k, _, _) in enumerate(KINDS)}
    rows.sort(
        key=lambda r: (GROUP_ORDER[r["group"]], r["kind"])
    )  # stable sort keeps selection order

    def encode(rows_):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as g:
            for r in rows_:
                g.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))
        return buf.getvalue()

    def with_ids(rows_):
        out = []
        per = collections.Counter()
        for r in rows_:
            per[r["kind"]] += 1
            out.append(
                {
                    "id": f"{r['kind']}-{per[r['kind']]:04d}",
                    "kind": r["kind"],
                    "group": r["group"],
                    "source": r["source"],
                    "sha256": r["sha256"],
                    "text": r["text"],
                }
            )
        return out

    final = with_ids(rows)
    blob = encode(final)
    if len(blob) > MAX_GZ_BYTES:
        # Reduce every kind by the same factor (keep the first pieces selected).
        f = MAX_GZ_BYTES / len(blob) * 0.97
        per_kind = collections.Counter(r["kind"] for r in rows)
        keep_n = {k: max(1, int(c * f)) for k, c in per_kind.items()}
        seen_k = collections.Counter()
        kept = []
        for r in rows:
            seen_k[r["kind"]] += 1
            if seen_k[r["kind"]] <= keep_n[r["kind"]]:
                kept.append(r)
        log(f"output {len(blob)} bytes > {MAX_GZ_BYTES}; reduced counts by factor {f:.3f}")
        rows = kept
        final = with_ids(rows)
        blob = encode(final)

    os.makedirs(OUT_DIR, exist_ok=True)
    tmp = OUT_FILE + ".tmp"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, OUT_FILE)

    # Summary
    by = collections.defaultdict(list)
    for r in final:
        by[(r["group"], r["kind"])].append(len(r["text"]))
    print(f"{'group':11s} {'kind':20s} {'count':>6s} {'median_len':>10s} {'files_avail':>11s}")
    gtot = collections.Counter()
    for g, k in sorted(by, key=lambda x: (GROUP_ORDER[x[0]], order[x[1]])):
        v = by[(g, k)]
        gtot[g] += len(v)
        print(f"{g:11s} {k:20s} {len(v):6d} {int(statistics.median(v)):10d} {avail.get(k, 0):11d}")
    for k, g, _ in KINDS:
        if (g, k) not in by:
            print(f"{g:11s} {k:20s} {0:6d} {'-':>10s} {avail.get(k, 0):11d}")
    for g in ("code", "prose", "structured"):
        print(f"TOTAL {g:15s} {gtot[g]:6d}")
    files = {
        r["source"].rsplit(":", 1)[0] if re.search(r":[0-9]+-[0-9]+$", r["source"]) else r["source"]
        for r in final
    }
    print(
        f"TOTAL rows {len(final)}; distinct source files {len(files)}; "
        f"{len(blob)} bytes gzipped; {time.time() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()
