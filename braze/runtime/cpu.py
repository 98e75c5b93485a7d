"""The CPU runtime: compile generated C with the system compiler, cache it, launch it.

``compile_c(source, symbols)`` feeds ``source`` to ``$CC`` (else ``cc``, else ``gcc``)
on stdin, builds a shared object with OpenMP, loads it with ctypes and returns a
``CompiledLibrary``. ``launch(fn, *args)`` calls a kernel and counts it.

The cache
    A shared object is stored under the sha256 of everything that determines it: the
    source, the compiler's identity (resolved path and ``--version`` output), the
    flags, the CPU (``-march=native`` code built on one machine may not run on another
    that shares a home directory) and braze's version. The directory is
    ``$BRAZE_CACHE_DIR``, else ``$XDG_CACHE_HOME/braze``, else ``~/.cache/braze``,
    created with mode 0700. A directory that is group/world accessible or owned by
    someone else is refused (one line on stderr) and braze compiles into a fresh
    private temp directory instead.

    Each entry is ``<key>.so`` plus ``<key>.so.sha256``, which holds the key and the
    digest of the .so's bytes. Every symbol a caller asks for is exported as
    ``<name>_<key[:16]>`` (a ``#define`` before the source), so the entry's name is in
    the code itself. An entry is trusted only if the sidecar names this key, its bytes
    match the sidecar, it loads, and it exports the symbols under this key; otherwise
    it is removed and rebuilt: another kernel's entry swapped in never runs. Writers compile into a unique temp file in the same
    directory and ``os.replace`` it into place (sidecar first), under an exclusive
    ``flock`` on ``<key>.lock``, so processes racing on one kernel compile it once and
    the others load the result; readers of a valid entry take no lock.

    ``kernels_compiled`` counts compiler runs; in-process, loaded libraries are kept in
    a dict by key, so a second ``compile_c`` of the same source costs one hash.

No compiler
    ``have_compiler()`` says once on stderr that braze will run the reference executor
    when there is no compiler; callers use it to choose their executor.

``BRAZE_DEBUG=2`` prints each source to stderr before it is compiled.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import CompileError
from ..stats import COUNTERS
from .threads import default_num_threads, get_num_threads, physical_cores, set_num_threads

try:  # CPython's own sha256: hashlib's import maps OpenSSL's libcrypto (3.5 MiB resident)
    from _sha256 import sha256
except ImportError:  # pragma: no cover - a Python without it (3.12 renamed it)
    from hashlib import sha256

__all__ = [
    "FLAGS",
    "CompiledLibrary",
    "CompilerNotFound",
    "cache_dir",
    "cache_key",
    "sha256",
    "compile_c",
    "compiler_available",
    "default_num_threads",
    "get_num_threads",
    "have_compiler",
    "launch",
    "physical_cores",
    "set_num_threads",
]

# -fno-math-errno: sqrtf becomes a vector sqrt instruction with no errno bookkeeping
# (no one reads errno after a kernel); inf/nan results are unchanged (sqrt(-1) is still
# nan). Measured over 1M floats in [-1, 3), single thread, gcc 12: sqrtf 8.9 ms -> 0.25 ms,
# 1/sqrtf(x+eps) 5.7 -> 0.38 ms, tanhf 30.7 -> 20.8 ms, expf unchanged (4.9 ms).
# No -ffast-math: braze keeps IEEE semantics (nan, inf, signed zero, no reassociation).
# -ffp-contract=fast: a * b + c becomes one fused multiply-add (one rounding instead of
# two, so each contracted step is as accurate or more), as -std=gnu11 does by default
# and CUDA/Triton do on GPUs; ISO -std=c11 turns it off. Measured on the custom-erf GELU
# (32x512x2048, 1 thread): 49 -> 40.5 ms, against 38 ms for the -ffast-math baseline.
FLAGS: tuple[str, ...] = (
    "-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-std=c11", "-fno-math-errno",
    "-ffp-contract=fast",
)

NO_COMPILER_MESSAGE = (
    "braze: no C compiler found (tried $CC, cc, gcc): running the reference executor, which is slower"
)

# How many source lines a CompileError quotes.
_SOURCE_LINES_IN_ERROR = 30


class CompilerNotFound(CompileError):
    """There is no C compiler: neither ``$CC`` nor ``cc`` nor ``gcc``."""


# --------------------------------------------------------------------------- warnings

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    print(message, file=sys.stderr, flush=True)


def _debug_level() -> int:
    try:
        return int(os.environ.get("BRAZE_DEBUG", "0") or 0)
    except ValueError:
        return 0


# --------------------------------------------------------------------------- compiler

_compiler_cache: dict[tuple[str | None, str | None], list[str] | None] = {}
_identity_cache: dict[tuple[str, ...], str] = {}
_compiler_lock = threading.Lock()


def _find_compiler() -> list[str] | None:
    """The compiler's argv prefix: ``$CC`` (split like a shell would), else cc, else gcc."""
    env_cc = os.environ.get("CC")
    memo = (env_cc, os.environ.get("PATH"))
    with _compiler_lock:
        if memo in _compiler_cache:
            return _compiler_cache[memo]
    found: list[str] | None = None
    if env_cc and env_cc.strip():
        argv = shlex.split(env_cc)
        path = shutil.which(argv[0])
        if path is not None:
            found = [path, *argv[1:]]
    if found is None:
        for name in ("cc", "gcc"):
            path = shutil.which(name)
            if path is not None:
                found = [path]
                break
        if found is not None and env_cc and env_cc.strip():
            _warn_once(f"cc:{env_cc}", f"braze: $CC={env_cc!r} was not found: compiling with {found[0]}")
    with _compiler_lock:
        _compiler_cache[memo] = found
    return found


def compiler_available() -> bool:
    """Whether a C compiler exists (no warning; see ``have_compiler``)."""
    return _find_compiler() is not None


def have_compiler() -> bool:
    """Whether a C compiler exists; when none does, say so once on stderr.

    Callers that would compile a kernel call this and run the reference executor when
    it returns False.
    """
    if _find_compiler() is not None:
        return True
    _warn_once("no-compiler", NO_COMPILER_MESSAGE)
    return False


def _compiler() -> list[str]:
    cc = _find_compiler()
    if cc is None:
        raise CompilerNotFound(NO_COMPILER_MESSAGE.removeprefix("braze: "))
    return cc


def _compiler_identity(cc: list[str]) -> str:
    """Resolved path and ``--version`` output, computed once per process per compiler."""
    key = tuple(cc)
    with _compiler_lock:
        if key in _identity_cache:
            return _identity_cache[key]
    try:
        proc = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
        version = proc.stdout + proc.stderr
    except (OSError, subprocess.SubprocessError) as e:
        version = f"<--version failed: {e}>"
    try:
        real = os.path.realpath(cc[0])
        st = os.stat(real)
        where = f"{' '.join(cc)} -> {real} ({st.st_size} bytes, mtime {st.st_mtime_ns})"
    except OSError:
        where = " ".join(cc)
    ident = f"{where}\n{version}"
    with _compiler_lock:
        _identity_cache[key] = ident
    return ident


_cpu_identity_value: str | None = None


def _cpu_identity() -> str:
    """What ``-march=native`` depends on: the CPU's model name and feature flags."""
    global _cpu_identity_value
    if _cpu_identity_value is None:
        import platform

        parts = [platform.machine()]
        try:
            with open("/proc/cpuinfo") as f:
                seen: set[str] = set()
                for line in f:
                    name, _, value = line.partition(":")
                    name = name.strip()
                    if name in ("vendor_id", "model name", "flags", "Features", "CPU part") and name not in seen:
                        seen.add(name)
                        parts.append(f"{name}: {value.strip()}")
        except OSError:
            parts.append(platform.processor())
        _cpu_identity_value = "\n".join(parts)
    return _cpu_identity_value


def _braze_version() -> str:
    braze = sys.modules.get("braze")
    version = getattr(braze, "__version__", None)
    if version is None:  # called while braze/__init__ is still running
        from importlib.metadata import PackageNotFoundError, version as dist_version

        try:
            version = dist_version("braze")
        except PackageNotFoundError:
            version = "unknown"
    return str(version)


def cache_key(source: str, flags: Sequence[str] = FLAGS, *, version: str | None = None,
              symbols: Sequence[str] = ()) -> str:
    """The sha256 naming the shared object built from ``source`` with ``flags``,
    exporting ``symbols`` (under this key: ``tagged_source``)."""
    cc = _compiler()
    h = sha256()
    for part in (
        "braze-cpu-cache-v2",
        "\0".join(sorted(set(symbols))),
        version if version is not None else _braze_version(),
        _compiler_identity(cc),
        _cpu_identity(),
        "\0".join(flags),
        source,
    ):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


# --------------------------------------------------------------------------- cache dir

_private_tmp: Path | None = None
_dir_lock = threading.Lock()


def _configured_cache_dir() -> Path:
    env = os.environ.get("BRAZE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "braze"
    return Path.home() / ".cache" / "braze"


def _private_temp_dir() -> Path:
    global _private_tmp
    with _dir_lock:
        if _private_tmp is None:
            path = Path(tempfile.mkdtemp(prefix="braze-cache-"))  # mode 0700
            atexit.register(shutil.rmtree, path, True)
            _private_tmp = path
        return _private_tmp


def _insecure_reason(path: Path) -> str | None:
    """Why ``path`` cannot be braze's cache (None when it can)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot stat it ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}, not private (0700)"
    return None


def cache_dir() -> Path:
    """The directory shared objects are cached in, created private if missing.

    A directory that exists but is not private to this user is refused, with one line
    on stderr, for a fresh private temp directory that lives as long as the process.
    """
    return _private_dir(_configured_cache_dir())


def runtime_dir() -> Path:
    """Where the machine-wide libraries live (``runtime/libraries.py``: C that every
    plan's modules link against, built once per machine, by ``make install``):
    ``$BRAZE_RUNTIME_DIR``, else ``braze-runtime`` beside the default cache directory.
    Not under ``$BRAZE_CACHE_DIR``: a process with an empty kernel cache still finds
    them. Held to the cache directory's rules (private to this user)."""
    env = os.environ.get("BRAZE_RUNTIME_DIR")
    if env:
        return _private_dir(Path(env).expanduser())
    xdg = os.environ.get("XDG_CACHE_HOME")
    return _private_dir((Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "braze-runtime")


def _private_dir(path: Path) -> Path:
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # the umask may have taken bits we did not ask for
        except FileExistsError:
            pass  # another process made it: check it like any existing directory
        except OSError as e:
            tmp = _private_temp_dir()
            _warn_once(f"dir:{path}", f"braze: cannot create the cache directory {path} ({e.strerror}): "
                                      f"compiling into the private temp directory {tmp} instead")
            return tmp
    reason = _insecure_reason(path)
    if reason is not None:
        tmp = _private_temp_dir()
        _warn_once(f"dir:{path}", f"braze: refusing the cache directory {path}: {reason}; "
                                  f"compiling into the private temp directory {tmp} instead")
        return tmp
    return path


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------- OpenMP

# OpenMP wait policy, decided from bench/omp_wait_policy.py on this project's 2-core
# machine (gcc 12 / libgomp), shared with other work (load average ~4 throughout, so
# "idle" means no *extra* load); element-wise float add, medians of 10 runs taken in 5
# interleaved rounds. small = 10k back-to-back launches over 4096 floats (us/launch);
# gap = the same with ~20 us of Python between launches, as in a decode step
# (us/launch); big = one launch over 32M floats (ms). "busy" adds one spinning process.
#
#   load  policy    nt   small    gap    big      load  policy    nt   small    gap    big
#   idle  default    1    3.04  14.91  23.84      busy  default    1    3.16   9.89  23.12
#   idle  default    2  120.97  77.42  34.88      busy  default    2   19.03  72.33  28.04
#   idle  active     1    3.04  14.00  29.84      busy  active     1    3.70  18.84  27.35
#   idle  active     2   45.56  54.35  33.69      busy  active     2   18.34  93.59  35.27
#   idle  passive    1    2.25  10.87  25.86      busy  passive    1    3.44  17.42  22.49
#   idle  passive    2   12.25  21.31  24.14      busy  passive    2   22.05  34.77  29.82
#   idle  spin=10k   1    2.30  11.16  23.34      busy  spin=10k   1    3.71  12.96  29.41
#   idle  spin=10k   2  487.72  62.29  25.90      busy  spin=10k   2   50.04 166.46  33.75
#
# At 2 threads, passive is best or within noise everywhere, and wins the realistic
# "gap" stream 2-3x: spinning workers (active, or libgomp's default 300k-iteration
# spin, or even a 10k spin) take a core from the Python thread that issues the next
# launch or from whatever else runs. Big kernels are memory-bound and do not care.
# So braze defaults to OMP_WAIT_POLICY=passive; a user's own OMP_WAIT_POLICY (or
# GOMP_SPINCOUNT, which only matters without a policy) is respected. Also visible: a
# 4096-float kernel is faster on 1 thread (~2-3 us) than on 2 under every policy, so
# generated kernels should parallelise only above a work threshold (``if(...)``).
#
# libgomp reads OMP_WAIT_POLICY once, when it is loaded, which is when the first kernel
# library is dlopened; braze sets it just before that, unless the user already has.
#
# Revisited with the captured decoding step (bench/RESULTS.md, "Quantized inference"),
# on the same machine while no other tenant was busy (load ~1): a captured step
# launches its ~500 kernels back to back, and a short spin catches the next launch
# where a passive team sleeps and pays the wake-up each time. SmolLM2 decoding at 2
# threads took 22.5 ms a step passive and 13.0 with GOMP_SPINCOUNT=30000 (1 thread:
# 17.0 / 17.2); prefill of 128 tokens 560 / 610 tok/s. So braze now spins briefly
# (30k iterations, tens of microseconds) and then sleeps. On an oversubscribed
# machine (the table above: a busy-looping neighbour, or the test suite's two
# processes on two cores) passive is still better; ``make test`` sets it, and a
# user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is respected.
_OMP_DEFAULTS: dict[str, str] = {"GOMP_SPINCOUNT": "30000"}
_omp_configured = False


def _configure_openmp() -> None:
    global _omp_configured
    if _omp_configured:
        return
    _omp_configured = True
    if "OMP_WAIT_POLICY" in os.environ:  # the user chose a policy: the spin count is theirs too
        return
    for name, value in _OMP_DEFAULTS.items():
        os.environ.setdefault(name, value)


# --------------------------------------------------------------------------- libraries

_ARGTYPES: dict[str, Any] = {
    "ptr": ctypes.c_void_p,
    "p": ctypes.c_void_p,
    "i64": ctypes.c_int64,
    "i32": ctypes.c_int32,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}


def symbol_tag(key: str) -> str:
    """The suffix every exported symbol of the entry ``key`` carries."""
    return key[:16]


def tagged_source(source: str, symbols: Sequence[str], key: str) -> str:
    """``source`` with each of ``symbols`` renamed ``<name>_<tag>`` by the preprocessor."""
    tag = symbol_tag(key)
    defines = "".join(f"#define {name} {name}_{tag}\n" for name in sorted(set(symbols)))
    return f"{defines}#line 1\n{source}"


class CompiledLibrary:
    """A loaded shared object and the kernels it exports.

    ``lib["name"]`` is the raw ctypes function; ``lib.function(name, argtypes)`` a
    fresh ctypes function with ``argtypes`` set (ctypes types, or the short names
    ``"ptr"``, ``"i64"``, ``"i32"``, ``"f32"``, ``"f64"``) and ``restype`` None.
    """

    def __init__(self, cdll: ctypes.CDLL, path: Path, key: str) -> None:
        self.cdll = cdll
        self.path = path
        self.key = key
        self.tag = symbol_tag(key)
        self.functions: dict[str, Any] = {}

    def _symbol(self, name: str) -> Any:
        return self.cdll[f"{name}_{self.tag}"]

    def _resolve(self, names: Sequence[str]) -> None:
        missing = []
        for name in names:
            if name in self.functions:
                continue
            try:
                self.functions[name] = self._symbol(name)
            except AttributeError:
                missing.append(name)
        if missing:
            raise CompileError(f"compiled library {self.path} does not export {', '.join(missing)}")

    def __getitem__(self, name: str) -> Any:
        if name not in self.functions:
            self._resolve([name])
        return self.functions[name]

    def function(self, name: str, argtypes: Sequence[Any], restype: Any = None) -> Any:
        try:
            fn = self._symbol(name)  # a new function object: argtypes are not shared
        except AttributeError:
            raise CompileError(f"compiled library {self.path} does not export {name}") from None
        fn.argtypes = [_ARGTYPES[a] if isinstance(a, str) else a for a in argtypes]
        fn.restype = restype
        return fn

    def __repr__(self) -> str:
        return f"CompiledLibrary({self.path.name}, {sorted(self.functions)})"


_loaded: dict[str, CompiledLibrary] = {}
_count_lock = threading.Lock()
_key_locks: dict[str, threading.Lock] = {}
_loaded_lock = threading.Lock()


def _clear_memory_cache() -> None:
    """Forget loaded libraries (tests; the libraries themselves stay mapped)."""
    with _loaded_lock:
        _loaded.clear()


def _sidecar(key: str, data: bytes) -> str:
    return f"{key} {sha256(data).hexdigest()}\n"


def _try_load(so: Path, key: str, symbols: Sequence[str], shared: bool = False) -> tuple[ctypes.CDLL | None, str | None]:
    """(library, None) for a valid entry, (None, None) when absent, (None, why) if corrupt."""
    try:
        data = so.read_bytes()
    except FileNotFoundError:
        return None, None
    try:
        recorded = Path(f"{so}.sha256").read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None, "its sha256 sidecar is missing or unreadable"
    if recorded != _sidecar(key, data):
        return None, "its sidecar does not name this entry and the digest of its bytes"
    tag = symbol_tag(key)
    for name in symbols:
        # before dlopen: another kernel's object is never loaded (nor, once loaded,
        # could its path be loaded again: the loader would hand back the old handle)
        if f"{name}_{tag}\0".encode() not in data:
            return None, f"it does not export {name} under this entry's key (another kernel's object)"
    _configure_openmp()
    try:
        cdll = ctypes.CDLL(str(so), mode=os.RTLD_GLOBAL if shared else ctypes.DEFAULT_MODE)
    except OSError as e:
        return None, f"dlopen failed: {e}"
    for name in symbols:
        if not hasattr(cdll, f"{name}_{tag}"):
            return None, f"it does not export {name} under this entry's key (another kernel's object)"
    return cdll, None


def _source_head(source: str) -> str:
    lines = source.splitlines()
    head = "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(lines[:_SOURCE_LINES_IN_ERROR]))
    more = len(lines) - _SOURCE_LINES_IN_ERROR
    return head + (f"\n      ... ({more} more lines)" if more > 0 else "")


def _build(cc: list[str], flags: Sequence[str], source: str, directory: Path, so: Path, key: str,
           background: bool = False) -> None:
    if _debug_level() >= 2:
        print(f"braze: compiling {so.name}:\n{source}", file=sys.stderr, flush=True)
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{so.stem[:16]}-", suffix=".so.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    sidecar_tmp = Path(f"{tmp_name}.sha256")
    cmd = [*cc, *flags, "-x", "c", "-", "-o", tmp_name]
    nice = shutil.which("nice") if background else None
    try:
        try:
            proc = subprocess.run([nice, "-n", "19", *cmd] if nice else cmd, input=source, capture_output=True,
                                  text=True)
        except OSError as e:
            raise CompileError(f"could not run the C compiler {cc[0]}: {e}") from e
        with _count_lock:  # compile units build in threads (runtime/units.py)
            COUNTERS["kernels_compiled"] += 1
        if proc.returncode != 0:
            raise CompileError(
                f"C compiler failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                f"--- compiler output ---\n{proc.stderr.strip() or proc.stdout.strip()}\n"
                f"--- source (first {_SOURCE_LINES_IN_ERROR} lines) ---\n{_source_head(source)}"
            )
        data = tmp.read_bytes()
        sidecar_tmp.write_text(_sidecar(key, data))
        os.replace(sidecar_tmp, f"{so}.sha256")
        os.replace(tmp, so)
    finally:
        _remove(tmp, sidecar_tmp)


def compile_c(source: str, symbol_names: Sequence[str], flags: Sequence[str] | None = None, *,
              background: bool = False, directory: Path | None = None, shared: bool = False) -> CompiledLibrary:
    """Compile (or fetch from the cache) ``source`` and resolve ``symbol_names`` in it
    (``background``: the compiler runs at nice 19, for work nobody waits on;
    ``directory``: another cache than ``cache_dir()``; ``shared``: loaded with global
    symbols, for objects loaded later to link against).

    Raises ``CompilerNotFound`` (a ``CompileError``) when there is no compiler, and
    ``CompileError`` with the compiler's output and the head of the source when the
    compiler rejects it.
    """
    flags = tuple(FLAGS if flags is None else flags)
    cc = _compiler()
    key = cache_key(source, flags, symbols=symbol_names)
    with _loaded_lock:
        lib = _loaded.get(key)
        if lib is None:
            key_lock = _key_locks.setdefault(key, threading.Lock())
    if lib is None:
        with key_lock:  # threads of this process: one compiles, the others wait
            with _loaded_lock:
                lib = _loaded.get(key)
            if lib is None:
                lib = _load_or_build(cc, flags, source, key, symbol_names, background, directory, shared)
                with _loaded_lock:
                    _loaded[key] = lib
    lib._resolve(symbol_names)
    return lib


def is_cached(source: str, symbol_names: Sequence[str], flags: Sequence[str] | None = None, *,
              directory: Path | None = None) -> bool:
    """Would ``compile_c(source, symbol_names)`` find a built object (loaded in this
    process, or in the cache directory) rather than compile?"""
    key = cache_key(source, tuple(FLAGS if flags is None else flags), symbols=symbol_names)
    with _loaded_lock:
        if key in _loaded:
            return True
    return ((directory or cache_dir()) / f"{key}.so").exists()


def build(source: str, symbol_names: Sequence[str], flags: Sequence[str] | None = None, *,
          background: bool = False, directory: Path | None = None) -> None:
    """Compile ``source`` into the cache unless an object is there, without loading it
    (``compile_c`` loads it later, and checks it then): objects that link against
    others are built in parallel with those, and loaded after them."""
    flags = tuple(FLAGS if flags is None else flags)
    cc = _compiler()
    key = cache_key(source, flags, symbols=symbol_names)
    directory = directory or cache_dir()
    so = directory / f"{key}.so"
    if so.exists():
        return
    with _file_lock(directory / f"{key}.lock"):
        if not so.exists():
            _build(cc, flags, tagged_source(source, symbol_names, key), directory, so, key, background)


def _load_or_build(cc: list[str], flags: Sequence[str], source: str, key: str, symbols: Sequence[str],
                   background: bool = False, directory: Path | None = None, shared: bool = False) -> CompiledLibrary:
    directory = directory or cache_dir()
    so = directory / f"{key}.so"
    cdll, _ = _try_load(so, key, symbols, shared)  # fast path: a valid entry needs no lock
    if cdll is None:
        with _file_lock(directory / f"{key}.lock"):  # processes: one compiles, the others wait
            cdll, corrupt = _try_load(so, key, symbols, shared)
            if corrupt is not None:
                _warn_once(f"corrupt:{so}", f"braze: cache entry {so} is corrupt ({corrupt}): rebuilding it")
                _remove(so, Path(f"{so}.sha256"))
            if cdll is None:
                _build(cc, flags, tagged_source(source, symbols, key), directory, so, key, background)
                cdll, corrupt = _try_load(so, key, symbols, shared)
                if cdll is None:
                    raise CompileError(f"the freshly compiled {so} does not load: {corrupt}")
    return CompiledLibrary(cdll, so, key)


def launch(fn: Any, *args: Any, _counters: dict[str, int] = COUNTERS) -> None:
    """Call a kernel and count the launch.

    Per-launch cost, measured with an empty 5-argument kernel (3 pointers, 2 int64)
    on this 2-core machine: ~1.1 us for the bare ctypes call (argtypes conversion is
    most of it), ~1.5 us through ``launch``. Getting a pointer from numpy costs more
    than the launch (``arr.ctypes.data`` ~2.6 us): callers should take each buffer's
    address once and pass ints.
    """
    _counters["kernel_launches"] += 1
    fn(*args)
