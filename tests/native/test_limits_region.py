"""The limits file (C parser vs Python writer/parser, fuzzing) and the region layout."""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from native_helpers import NATIVE, UUIDS, Build, Claim, MiB

from tessera.enforcement import region as R
from tessera.enforcement.limits import (
    GpuLimit,
    Limits,
    LimitsError,
    format_limits,
    parse_limits,
    read_limits,
    write_limits,
)

pytestmark = pytest.mark.native

SAMPLES = [
    Limits(region="/run/tessera/claims/0a1b/usage", gpus=(GpuLimit(UUIDS[0], 8000 * MiB, 30),)),
    Limits(
        region="/r",
        gpus=(
            GpuLimit("GPU-ABCDEF01-2345-6789-abcd-ef0123456789", 1, 0),
            GpuLimit("MIG-00000000-0000-0000-0000-000000000001", 2**64 - 1, 100),
        ),
        context_overhead=314572800,
        claim="team-a/train-0",
        claim_uid="6f1c2d3e-0000-4000-8000-000000000000",
    ),
    Limits(  # a share and two whole devices of one claim (a GPU and a MIG device)
        region="/run/tessera/region",
        gpus=(GpuLimit(UUIDS[1], 4096 * MiB, 25),),
        claim="team-a/mixed",
        claim_uid="0b5e1c2d-0000-4000-8000-000000000000",
        unlimited=(UUIDS[2], "MIG-0E5D1C2B-AAAA-4BBB-8CCC-000000000002"),
    ),
    Limits(  # a work-conserving share beside a strict one; the node's shares directory
        region="/run/tessera/region",
        gpus=(
            GpuLimit(UUIDS[0], 4096 * MiB, 30, "work-conserving"),
            GpuLimit(UUIDS[1], 4096 * MiB, 0),
        ),
        shares="/run/tessera/shares",
    ),
    Limits(
        region="/x",
        gpus=tuple(
            GpuLimit(f"GPU-{i:08x}-0000-0000-0000-000000000000", (i + 1) * MiB, i * 6)
            for i in range(16)
        ),
    ),
]


def _dump(build: Build, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([build.prog("limits_dump"), path], capture_output=True, text=True)


@pytest.mark.parametrize("i", range(len(SAMPLES)))
def test_python_writer_and_c_parser_round_trip(tmp_path: Path, plain: Build, i: int) -> None:
    lim = SAMPLES[i]
    p = str(tmp_path / "limits")
    write_limits(p, lim)
    assert (Path(p).stat().st_mode & 0o777) == 0o444
    r = _dump(plain, p)
    assert r.returncode == 0, r.stdout
    text = Path(p).read_text()
    assert r.stdout == text  # C canonical form == what Python wrote
    back = read_limits(p)
    assert back == parse_limits(r.stdout)
    assert [g.uuid for g in back.gpus] == [g.uuid[:4] + g.uuid[4:].lower() for g in lim.gpus]
    assert (back.region, back.context_overhead, back.claim, back.claim_uid, back.shares) == (
        lim.region,
        lim.context_overhead,
        lim.claim,
        lim.claim_uid,
        lim.shares,
    )
    assert [g.policy for g in back.gpus] == [g.policy for g in lim.gpus]


@pytest.mark.parametrize(
    ("text", "line", "msg"),
    [
        ("", 0, "empty file"),
        ("region /r\n", 1, "expected 'version <N>' first"),
        ("version x\nregion /r\n", 1, "expected 'version <N>' first"),
        (
            "version 3\nregion /r\n",
            1,
            "version 3 is newer than this library reads (versions 1..2): upgrade the node's "
            "enforcement library",
        ),
        ("version 0\nregion /r\n", 1, "version 0 is not a limits file version (this library"),
        (f"version 2\nregion /r\ngpu {UUIDS[0]} memory 1 cores 1\nversion 2\n", 4, "duplicate"),
        (f"version 1\ngpu {UUIDS[0]} memory 1 cores 1\n", 2, "missing 'region'"),
        ("version 1\nregion /r\n", 2, "no 'gpu' lines"),
        ("version 1\nregion r\n", 2, "region path must be absolute"),
        (f"version 1\nregion /r\ngpu {UUIDS[0]} memory 0 cores 1\n", 3, "memory must be"),
        (f"version 1\nregion /r\ngpu {UUIDS[0]} memory 1 cores 101\n", 3, "cores must be"),
        (f"version 1\nregion /r\ngpu {UUIDS[0]} memory +1 cores 1\n", 3, "memory must be"),
        (
            f"version 1\nregion /r\ngpu {UUIDS[0]} memory 18446744073709551616 cores 1\n",
            3,
            "memory must be",
        ),
        ("version 1\nregion /r\ngpu GPU-0000 memory 1 cores 1\n", 3, "bad GPU UUID"),
        (
            f"version 1\nregion /r\ngpu {UUIDS[0]} memory 1 cores 1\ngpu {UUIDS[0].upper()[4:]}"
            " memory 1 cores 1\n",
            4,
            "bad GPU UUID",
        ),
        (
            f"version 1\nregion /r\ngpu {UUIDS[0]} memory 1 cores 1\n"
            f"gpu GPU-{UUIDS[0][4:].upper()} memory 1 cores 1\n",
            4,
            "duplicate gpu",
        ),
        ("version 1\nregion /r\nregion /s\n", 3, "duplicate 'region'"),
        ("version 1\nlimit 5\n", 2, "unknown keyword 'limit'"),
        (
            f"version 1\nregion /r\ngpu {UUIDS[0]} memory 1 cores 1\nunlimited {UUIDS[0]}\n",
            4,
            f"duplicate gpu {UUIDS[0]}",
        ),
        (
            f"version 1\nregion /r\nunlimited {UUIDS[1].upper()}\n"
            f"gpu GPU-{UUIDS[1][4:]} memory 1 cores 1\n",
            4,
            f"duplicate gpu {UUIDS[1]}",
        ),
        ("version 1\nregion /r\nunlimited GPU-0000\n", 3, "bad GPU UUID"),
        (f"version 1\nregion /r\nunlimited {UUIDS[0]} x\n", 3, "expected 'unlimited <UUID>'"),
        (f"version 1\nregion /r\nunlimited {UUIDS[0]}\n", 3, "no 'gpu' lines"),
        (
            f"version 1\nregion /r\ngpu {UUIDS[0]} memory 1 cores 1\n"
            + "".join(f"unlimited GPU-{i:08x}-0000-0000-0000-000000000000\n" for i in range(33)),
            36,
            "more than 32 unlimited devices",
        ),
        ("version 1\nregion /r\x01\n", 2, "control or non-ASCII byte 0x01"),
        ("version 1\nregion /r\u00e9\n", 0, "non-ASCII"),
        ("version 1\nregion /r x\n", 2, "expected 'region <absolute path>'"),
        (
            f"version 1\nregion /r\ngpu {UUIDS[0]} memory 1 cores 1 policy greedy\n",
            3,
            "policy must be strict or work-conserving",
        ),
        (
            f"version 1\nregion /r\ngpu {UUIDS[0]} memory 1 cores 1 mode strict\n",
            3,
            "[policy strict|work-conserving]",
        ),
        ("version 1\nregion /r\nshares rel\n", 3, "shares path must be absolute"),
        ("version 1\nregion /r\nshares /a\nshares /b\n", 4, "duplicate 'shares'"),
        ("version 1\nclaim ns-name uid\n", 2, "claim must be"),
        ("version 1\n" + "x" * 4096 + "\n", 2, "line longer than 4095 bytes"),
    ],
)
def test_both_parsers_reject_the_same_errors(
    tmp_path: Path, plain: Build, text: str, line: int, msg: str
) -> None:
    with pytest.raises(LimitsError) as e:
        parse_limits(text)
    assert e.value.line == line and msg in e.value.message
    p = tmp_path / "limits"
    p.write_bytes(text.encode("utf-8"))
    r = _dump(plain, str(p))
    assert r.returncode == 1
    if line:  # the C parser counts lines the same way and says the same thing
        assert r.stdout.startswith(f"error: line {line}: ") and msg in r.stdout, r.stdout


def test_writer_refuses_what_the_library_would_not_read(tmp_path: Path) -> None:
    bad = [
        Limits(region="relative", gpus=(GpuLimit(UUIDS[0], 1, 0),)),
        Limits(region="/a b", gpus=(GpuLimit(UUIDS[0], 1, 0),)),
        Limits(region="/r", gpus=(GpuLimit(UUIDS[0], 1, 101),)),
        Limits(region="/r", gpus=()),
        Limits(region="/r", gpus=(GpuLimit(UUIDS[0], 1, 0),), claim="ns/n"),
    ]
    for lim in bad:
        with pytest.raises(LimitsError):
            format_limits(lim)
        with pytest.raises(LimitsError):
            write_limits(str(tmp_path / "l"), lim)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def _mutations(rng: random.Random, n: int) -> list[bytes]:
    seeds = [format_limits(s).encode() for s in SAMPLES] + [
        b"# c\n\nversion 1\r\n  region\t/x \r\ngpu GPU-00000000-0000-0000-0000-000000000000 memory 5"
        b" cores 7\n",
    ]
    words = [
        b"version",
        b"region",
        b"gpu",
        b"memory",
        b"cores",
        b"claim",
        b"context-overhead",
        b"1",
        b"0",
        b"100",
        b"101",
        b"18446744073709551615",
        b"18446744073709551616",
        b"GPU-",
        b"MIG-",
        b"#",
        b"\n",
        b" ",
        b"\t",
        b"\r",
        b"/",
        b"-",
        b"\x00",
        b"\xc3\xa9",
    ]
    out = []
    for _ in range(n):
        b = bytearray(rng.choice(seeds))
        if rng.random() < 0.5:  # mutations that keep the file valid more often than not
            lines = bytes(b).split(b"\n")
            i = rng.randrange(len(lines))
            choice = rng.randrange(4)
            if choice == 0:
                lines.insert(i, b"# " + bytes(rng.randrange(32, 127) for _ in range(8)))
            elif choice == 1:
                lines[i] = lines[i].replace(b" ", rng.choice([b"  ", b"\t", b" \t "]))
            elif choice == 2:
                lines[i] = re.sub(
                    rb"\d+", lambda _m: str(rng.randrange(0, 2**65)).encode(), lines[i], count=1
                )
            else:
                lines[i] = lines[i].upper() if rng.random() < 0.5 else lines[i] + b"\r"
            out.append(b"\n".join(lines))
            continue
        for _ in range(rng.randint(1, 3)):
            pos = rng.randint(0, len(b))
            op = rng.randrange(5)
            if op == 0 and b:
                b[pos % len(b)] ^= 1 << rng.randrange(8)
            elif op == 1 and b:
                del b[pos : pos + rng.randint(1, 8)]
            elif op == 2:
                b[pos:pos] = rng.choice(words)
            elif op == 3:
                del b[pos:]
            elif b:
                b[pos % len(b)] = rng.randrange(256)
        out.append(bytes(b))
    return out


def test_c_and_python_parsers_agree_on_random_inputs(asan: Build) -> None:
    """Differential fuzzing, fixed seed: same accept/reject and same canonical text, with the
    C parser under AddressSanitizer reading exact-size buffers."""
    inputs = _mutations(random.Random(20240611), 4000)
    stdin = b"".join(struct.pack("<I", len(x)) + x for x in inputs)
    r = subprocess.run(
        [asan.prog("limits_dump"), "--batch"],
        input=stdin,
        capture_output=True,
        env={"ASAN_OPTIONS": "detect_leaks=1"},
    )
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert len(lines) == len(inputs)
    accepted = 0
    for data, line in zip(inputs, lines, strict=True):
        try:
            py = format_limits(parse_limits(data)).encode()
        except LimitsError:
            assert line == "error", data
            continue
        accepted += 1
        assert line == "ok " + py.hex(), data
    assert 200 < accepted < len(inputs) - 200  # both outcomes well exercised


def test_parser_fuzz_under_asan(asan: Build) -> None:
    r = subprocess.run(
        [asan.prog("limits_fuzz"), "1", "150000"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    acc, rej = (int(x.split("=")[1]) for x in r.stdout.split())
    assert acc + rej == 150000 and acc > 1000 and rej > 1000


def test_parser_libfuzzer(build_root: Path) -> None:
    if shutil.which("clang") is None:
        pytest.skip("clang not installed: libFuzzer harness not run (apt-get install clang)")
    b = build_root / "fuzz"
    r = subprocess.run(
        ["make", "-C", str(NATIVE), f"BUILD={b}", "libfuzzer"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    corpus = b / "corpus"
    corpus.mkdir(exist_ok=True)
    for i, s in enumerate(SAMPLES):
        (corpus / f"seed{i}").write_text(format_limits(s))
    r = subprocess.run(
        [
            str(b / "fuzz" / "limits_libfuzzer"),
            "-seed=1",
            "-runs=200000",
            "-max_len=4096",
            str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Done 200000 runs" in r.stderr


def test_region_layout_matches_the_header(plain: Build) -> None:
    out = subprocess.run(
        [plain.prog("region_layout")], capture_output=True, text=True, check=True
    ).stdout
    c = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert c["magic"] == R.MAGIC and c["version"] == R.VERSION
    assert (c["max_gpus"], c["max_slots"], c["uuid_len"]) == (R.MAX_GPUS, R.MAX_SLOTS, R.UUID_LEN)
    assert (c["header_size"], c["gpu_size"], c["slot_size"], c["file_size"]) == (
        R.HEADER_SIZE,
        R.GPU_SIZE,
        R.SLOT_SIZE,
        R.FILE_SIZE,
    )
    assert c["lock_byte"] == R.LOCK_BYTE
    assert {k: v for k, v in c.items() if "." in k} == R.OFFSETS


def test_region_reader_rejects_foreign_files(tmp_path: Path) -> None:
    p = tmp_path / "r"
    p.write_bytes(b"\0" * R.FILE_SIZE)
    with pytest.raises(R.RegionError, match="bad magic"):
        R.read_region(str(p))
    p.write_bytes(b"x")
    with pytest.raises(R.RegionError, match="expected 230976"):
        R.read_region(str(p))


def _fixed_build(b: Path, fixed: Path, owner: int, plain: Build) -> Build:
    r = subprocess.run(
        [
            "make",
            "-C",
            str(NATIVE),
            f"BUILD={b}",
            "fixed",
            f"FIXED_LIMITS_PATH={fixed}",
            f"FIXED_LIMITS_OWNER={owner}",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return Build(b, b / "fixed" / "libtessera-enforce.so", plain.fake, plain.bin)


def test_fixed_path_wins_over_the_environment(
    tmp_path: Path, build_root: Path, plain: Build
) -> None:
    fixed = tmp_path / "etc" / "limits"
    fixed.parent.mkdir()
    lib = _fixed_build(build_root / "fixedpath", fixed, os.getuid(), plain)
    inside = Claim(tmp_path, lib, [GpuLimit(UUIDS[0], 100 * MiB, 0)], name="inside")
    shutil.copy(inside.limits_path, fixed)
    wide = Claim(tmp_path, lib, [GpuLimit(UUIDS[0], 10000 * MiB, 0)], name="wide")
    # the user points the env at a file with a larger limit, or unsets it: the fixed file rules
    for env in (wide.limits_path, ""):
        out = wide.tp("link", "init", "dev", "0", "meminfo", TESSERA_LIMITS_FILE=env)
        assert out[2] == f"meminfo 0 free={100 * MiB} total={100 * MiB}"
    # a fixed file that does not parse fails closed: no GPU memory at all
    fixed.chmod(0o644)
    fixed.write_text("version 1\nregion /r\ngpu nonsense\n")
    r = wide.run("tp_cuda", "link", "init", "dev", "0")
    assert r.stdout.splitlines() == ["init 0", "dev 0 2"]  # not even a context
    assert (
        "line 3: expected 'gpu <UUID> memory <bytes> cores <0-100>' [policy strict|work-conserving]"
        in r.stderr
    )
    assert "refusing GPU memory" in r.stderr


def test_anything_at_the_fixed_path_but_a_root_owned_file_fails_closed(
    tmp_path: Path, build_root: Path, plain: Build
) -> None:
    """Only nothing at all at the fixed path lets the environment choose the limits: a dangling
    symlink, any symlink (on the path too), a directory, a FIFO, a writable file or another
    owner's file makes the library refuse GPU memory. (The owner the test builds expect is the
    test user, standing for root.)"""
    etc = tmp_path / "etc"
    fixed = etc / "tessera" / "limits"
    lib = _fixed_build(build_root / "fixedrules", fixed, os.getuid(), plain)
    good = Claim(tmp_path, lib, [GpuLimit(UUIDS[0], 100 * MiB, 0)], name="good")
    env_claim = Claim(tmp_path, lib, [GpuLimit(UUIDS[0], 200 * MiB, 0)], name="env")

    def run() -> tuple[str, str]:
        r = env_claim.run("tp_cuda", "link", "init", "dev", "0", "meminfo", timeout=20)
        return " / ".join(r.stdout.splitlines()[1:]), r.stderr

    def reset() -> None:
        if fixed.is_symlink() or fixed.is_file() or fixed.is_fifo():
            fixed.unlink()
        elif fixed.is_dir():
            fixed.rmdir()
        if (etc / "tessera").is_symlink():
            (etc / "tessera").unlink()

    # nothing there (not even the directory): the environment's file is used
    from_env = f"dev 0 0 / meminfo 0 free={200 * MiB} total={200 * MiB}"
    assert run()[0] == from_env
    etc.mkdir()
    assert run()[0] == from_env
    (etc / "tessera").mkdir()
    assert run()[0] == from_env
    for what, msg in [
        ("dangling symlink", "is a symbolic link"),
        ("symlink to a good file", "is a symbolic link"),
        ("directory", "not a regular file"),
        ("fifo", "not a regular file"),
        ("writable", "writable by group or others"),
        ("parent symlink", "is a symbolic link"),
    ]:
        reset()
        if what == "dangling symlink":
            fixed.symlink_to(tmp_path / "nowhere")
        elif what == "symlink to a good file":
            fixed.symlink_to(good.limits_path)
        elif what == "directory":
            fixed.mkdir()
        elif what == "fifo":
            os.mkfifo(fixed)
        elif what == "writable":
            shutil.copy(good.limits_path, fixed)
            fixed.chmod(0o666)
        else:
            real = tmp_path / "real-tessera"
            real.mkdir(exist_ok=True)
            shutil.copy(good.limits_path, real / "limits")
            (etc / "tessera").rmdir()
            (etc / "tessera").symlink_to(real)
        line, err = run()
        assert line.startswith("dev 0 2"), what  # not even a context
        assert msg in err and "refusing GPU memory" in err, (what, err)
        if what == "parent symlink":
            (etc / "tessera").unlink()
            (etc / "tessera").mkdir()
    reset()
    shutil.copy(good.limits_path, fixed)
    fixed.chmod(0o444)
    out = good.tp("link", "init", "dev", "0", "meminfo")
    assert out[1:] == ["dev 0 0", f"meminfo 0 free={100 * MiB} total={100 * MiB}"]
    # the same file, but the library expects another owner (root, in production)
    other = _fixed_build(build_root / "fixedowner", fixed, os.getuid() + 1, plain)
    r = Claim(tmp_path, other, [GpuLimit(UUIDS[0], 100 * MiB, 0)], name="other").run(
        "tp_cuda", "link", "init", "dev", "0"
    )
    assert r.stdout.splitlines()[1] == "dev 0 2"
    assert "not owned by root" in r.stderr


def test_one_program_under_valgrind(tmp_path: Path, plain: Build) -> None:
    vg = shutil.which("valgrind")
    if vg is None:
        pytest.fail("valgrind not installed (apt-get install valgrind)")
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 100 * MiB, 0)], context_overhead=MiB)
    env = c.env()
    cmd = [
        vg,
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--track-fds=no",
        "-q",
        plain.prog("tp_cuda"),
        "procaddr",
        "init",
        "dev",
        "0",
        "alloc",
        str(50 * MiB),
        "alloc",
        str(60 * MiB),
        "vmm",
        str(2 * MiB),
        "pool",
        "4096",
        "array",
        "64",
        "64",
        "meminfo",
        "nvml",
        "0",
        "freeall",
        "meminfo",
        "launch",
        "100",
        "1",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-3:] == [
        "freeall 0",
        f"meminfo 0 free={97 * MiB} total={100 * MiB}",
        "launch 0",
    ]  # the default pool keeps its 2 MiB chunk


def test_every_route_under_valgrind(tmp_path: Path, plain: Build) -> None:
    """VMM references, pools, graph memory, contexts, limits and the loader, under memcheck."""
    vg = shutil.which("valgrind")
    if vg is None:
        pytest.fail("valgrind not installed (apt-get install valgrind)")
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 100 * MiB, 0)], context_overhead=MiB)
    cmd = [
        vg,
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--track-fds=no",
        "-q",
        plain.prog("tp_cuda"),
        "procaddr",
        "init",
        "dev",
        "0",
        "reserve",
        str(16 * MiB),
        "create",
        str(2 * MiB),
        "dev",
        "map",
        "0",
        "retain",
        "0",
        "vrelease",
        "1",
        "vrelease",
        "0",
        "mc",
        str(2 * MiB),
        "create",
        str(2 * MiB),
        "dev",
        "mcbind",
        "2",
        "3",
        "vrelease",
        "3",
        "mcunbind",
        "2",
        "unmap",
        "0",
        "poolcreate",
        "dev",
        "palloc",
        "0",
        str(3 * MiB),
        "pfree",
        "pdestroy",
        "0",
        "gcreate",
        "galloc",
        "0",
        str(2 * MiB),
        "ginst",
        "0",
        "0",
        "glaunch",
        "0",
        "gfreeptr",
        "0",
        "gdestroy",
        "0",
        "gtrim",
        "setlimit",
        "heap",
        str(16 * MiB),
        "nextalloc",
        str(MiB),
        "free",
        "deepbind",
        str(MiB),
        "freeall",
        "dlmopen",
        "reset",
        "0",
        "dev",
        "0",
        "meminfo",
    ]
    r = subprocess.run(cmd, env=c.env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-3:] == [
        "reset 0 0",
        "dev 0 0",
        f"meminfo 0 free={99 * MiB} total={100 * MiB}",
    ]
