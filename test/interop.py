"""Interoperability of mpq's safetensors files with the reference implementation
(the `safetensors` package from PyPI, with numpy).

usage: python test/interop.py BUILD_DIR   (BUILD_DIR holds st_tool and mpq)

1. Files mpq writes open in the package, which gives the same tensors (names,
   dtypes, shapes, bytes) and the same metadata as mpq reads back.
2. Files the package writes (F32, F16, BF16, with metadata and non-ASCII
   names) are read by mpq to the same values.
3. A checkpoint the package writes, quantized by `mpq quantize`, opens in the
   package; the metadata's section table slices the packed bytes as described
   (magic, permutation).
4. A GGUF file the `gguf` package (llama.cpp's gguf-py) writes with random
   blocks of every quantized type mpq reads (Q8_0 .. Q5_1, the k-quants Q2_K ..
   Q6_K, IQ4_NL, IQ4_XS) is read by mpq to exactly the package's dequantized
   values.
Prints one line per check and "interop: N passed, M failed"; exits 1 on failure.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import safetensors
from safetensors import safe_open
from safetensors.numpy import save_file

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL", what)


def dump(tool, path, outdir):
    os.makedirs(outdir, exist_ok=True)
    subprocess.run([tool, "dump", path, outdir], check=True)
    with open(os.path.join(outdir, "dump.json"), encoding="utf-8") as f:
        d = json.load(f)
    return d


def read(outdir, i, ext):
    with open(os.path.join(outdir, "%d.%s" % (i, ext)), "rb") as f:
        return f.read()


def package_view(path):
    """name -> (dtype, shape, bytes), and the metadata, through the package."""
    with open(path, "rb") as f:
        raw = f.read()
    tensors = {name: (t["dtype"], list(t["shape"]), bytes(t["data"])) for name, t in safetensors.deserialize(raw)}
    with safe_open(path, "numpy") as f:
        meta = f.metadata() or {}
    return tensors, meta


def mpq_writes_package_reads(build, tmp):
    path = os.path.join(tmp, "mpq.safetensors")
    subprocess.run([os.path.join(build, "st_tool"), "write", path], check=True)
    d = dump(os.path.join(build, "st_tool"), path, os.path.join(tmp, "d1"))
    tensors, meta = package_view(path)
    check(set(tensors) == {t["name"] for t in d["tensors"]}, "mpq file: same tensor names")
    check(meta == d["metadata"], "mpq file: same metadata")
    check(meta.get("mpq.version") == "1", "mpq file: convention version")
    for i, t in enumerate(d["tensors"]):
        dtype, shape, data = tensors[t["name"]]
        check(dtype == t["dtype"] and shape == t["shape"], "mpq file: %s dtype and shape" % t["name"])
        check(data == read(os.path.join(tmp, "d1"), i, "raw"), "mpq file: %s bytes" % t["name"])
    # values through numpy, where numpy has the dtype
    with safe_open(path, "numpy") as f:
        for i, t in enumerate(d["tensors"]):
            if t["dtype"] in ("F32", "F16"):
                want = np.frombuffer(read(os.path.join(tmp, "d1"), i, "f32"), dtype=np.float32)
                got = f.get_tensor(t["name"]).astype(np.float32).reshape(-1)
                check(np.array_equal(got.view(np.uint32), want.view(np.uint32)), "mpq file: %s values" % t["name"])
            if t["packed"]:
                got = f.get_tensor(t["name"])
                check(got.dtype == np.uint8 and got.ndim == 1, "mpq file: %s is a U8 vector" % t["name"])
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
    check((8 + n) % 8 == 0, "mpq file: header padded to 8 bytes")


def package_writes_mpq_reads(build, tmp):
    rng = np.random.default_rng(7)
    specials = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 6e-8, 1e-40, np.inf, -np.inf, 3.0e38], dtype=np.float32)
    f32 = np.concatenate([specials, (rng.standard_t(4, 200) * 0.02).astype(np.float32)]).reshape(21, 10)
    f16 = (rng.standard_normal((7, 13)) * 3).astype(np.float16)
    f16.reshape(-1)[:4] = np.array([np.inf, -0.0, 6e-8, 65504], dtype=np.float16)
    bf16_bits = (rng.integers(0, 1 << 16, 33, dtype=np.uint32)).astype(np.uint16)
    bf16_bits[(bf16_bits & 0x7F80) == 0x7F80] = 0x3F80  # no NaN (compared by value below)
    path = os.path.join(tmp, "py.safetensors")
    save_file({"w.f32": f32, "w.f16": f16, "w\u00e9ird/\u540d": f32[:2]}, path, metadata={"format": "pt", "k": "\u2713"})
    # BF16 has no numpy dtype: the package's low-level serializer takes raw bytes
    spec = safetensors.TensorSpec(dtype="bfloat16", shape=[3, 11], data_ptr=bf16_bits.ctypes.data,
                                  data_len=bf16_bits.nbytes)
    path_bf = os.path.join(tmp, "py_bf16.safetensors")
    safetensors.serialize_file({"w.bf16": spec}, path_bf, metadata={"dtype": "bf16"})
    d = dump(os.path.join(build, "st_tool"), path, os.path.join(tmp, "d2"))
    check(d["metadata"] == {"format": "pt", "k": "\u2713"}, "package file: metadata")
    names = [t["name"] for t in d["tensors"]]
    check(sorted(names) == sorted(["w.f32", "w.f16", "w\u00e9ird/\u540d"]), "package file: names (UTF-8)")
    expect = {"w.f32": f32, "w.f16": f16.astype(np.float32), "w\u00e9ird/\u540d": f32[:2]}
    for i, t in enumerate(d["tensors"]):
        got = np.frombuffer(read(os.path.join(tmp, "d2"), i, "f32"), dtype=np.float32)
        want = expect[t["name"]].reshape(-1)
        check(t["shape"] == list(expect[t["name"]].shape), "package file: %s shape" % t["name"])
        check(np.array_equal(got.view(np.uint32), want.view(np.uint32)), "package file: %s values" % t["name"])
    d = dump(os.path.join(build, "st_tool"), path_bf, os.path.join(tmp, "d3"))
    got = np.frombuffer(read(os.path.join(tmp, "d3"), 0, "f32"), dtype=np.float32)
    want = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    check(d["tensors"][0]["dtype"] == "BF16" and d["tensors"][0]["shape"] == [3, 11], "package file: BF16 header")
    check(np.array_equal(got.view(np.uint32), want.view(np.uint32)), "package file: BF16 values")


def quantized_checkpoint_opens(build, tmp):
    rng = np.random.default_rng(11)
    src = os.path.join(tmp, "model.safetensors")
    save_file({"layers.0.w": (rng.standard_t(4, (64, 256)) * 0.02).astype(np.float16),
               "layers.1.w": (rng.standard_t(4, (48, 200)) * 0.02).astype(np.float32),
               "norm": np.ones(256, dtype=np.float32)}, src, metadata={"format": "pt"})
    out = os.path.join(tmp, "q.safetensors")
    subprocess.run([os.path.join(build, "mpq"), "quantize", "--quiet", "--bits", "3", src, out], check=True)
    tensors, meta = package_view(out)
    check(meta.get("format") == "pt", "quantized: input metadata carried")
    check(tensors["norm"][2] == np.ones(256, dtype=np.float32).tobytes(), "quantized: norm copied")
    for name, rows, cols in (("layers.0.w", 64, 256), ("layers.1.w", 48, 200)):
        dtype, shape, data = tensors[name]
        check(dtype == "U8" and shape == [len(data)], "quantized: %s stored as U8" % name)
        check(meta.get("mpq.%s.format" % name) == "bitplane", "quantized: %s format" % name)
        check(meta.get("mpq.%s.shape" % name) == "%d,%d" % (rows, cols), "quantized: %s shape" % name)
        check(meta.get("mpq.%s.bits" % name) == "3", "quantized: %s widths" % name)
        check(data[:8] == b"MPQBITP\0", "quantized: %s magic" % name)
        sections = {}
        for part in meta["mpq.%s.sections" % name].split():
            key, off, n = part.split(":")
            sections[key] = (int(off), int(n))
        ok = all(off % 64 == 0 and off + n <= len(data) for off, n in sections.values())
        check(ok, "quantized: %s sections inside the tensor, 64-byte aligned" % name)
        off, n = sections["bits"]
        groups = (cols + 127) // 128
        check(n == (rows + 15) // 16 * groups and set(data[off:off + n]) == {3}, "quantized: %s bits map" % name)
        off, n = sections["band_index"]
        band = np.frombuffer(data[off:off + n], dtype="<u8")
        doff, dn = sections["data"]
        check(band[0] == 0 and band[-1] == dn and np.all(np.diff(band.astype(np.int64)) >= 0),
              "quantized: %s band index" % name)


# ggml types mpq converts (the k-quants and IQ4 among them): block size,
# bytes per block, and where each block keeps its fp16 scales
GGUF_TYPES = {
    "Q8_0": (32, 34, [0]), "Q4_0": (32, 18, [0]), "Q4_1": (32, 20, [0, 2]), "Q5_0": (32, 22, [0]),
    "Q5_1": (32, 24, [0, 2]), "Q2_K": (256, 84, [80, 82]), "Q3_K": (256, 110, [108]),
    "Q4_K": (256, 144, [0, 2]), "Q5_K": (256, 176, [0, 2]), "Q6_K": (256, 210, [208]),
    "IQ4_NL": (32, 18, [0]), "IQ4_XS": (256, 136, [0]),
}


def gguf_package_writes_mpq_reads(build, tmp):
    """Random blocks of every quantized type mpq reads, written by the gguf
    package (llama.cpp's gguf-py); mpq's values equal the package's
    dequantization."""
    import gguf
    from gguf.quants import dequantize
    rng = np.random.default_rng(2026)
    path = os.path.join(tmp, "k.gguf")
    w = gguf.GGUFWriter(path, "test")
    rows, cols = 3, 512
    want = {}
    for name, (block, size, halves) in GGUF_TYPES.items():
        qt = gguf.GGMLQuantizationType[name]
        nb = rows * cols // block
        raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
        for h in halves:  # finite scales of moderate size
            v = (rng.standard_normal(nb) * 0.05).astype(np.float16)
            raw[:, h:h + 2] = v.view(np.uint8).reshape(nb, 2)
        data = raw.reshape(rows, cols // block * size)
        w.add_tensor(name, data, raw_dtype=qt)
        want[name] = dequantize(data, qt).reshape(-1).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = os.path.join(tmp, "dk")
    os.makedirs(out, exist_ok=True)
    subprocess.run([os.path.join(build, "st_tool"), "gguf", path, out], check=True)
    with open(os.path.join(out, "dump.json"), encoding="utf-8") as f:
        d = json.load(f)
    for i, t in enumerate(d["tensors"]):
        name = t["name"]
        got = np.frombuffer(read(out, i, "f32"), dtype=np.float32)
        ok = t["type"] == name and t["ne"] == [cols, rows] and got.shape == want[name].shape
        diff = np.max(np.abs(got - want[name])) if ok else float("inf")
        check(ok and diff == 0, "gguf %s: mpq and the gguf package differ by up to %g" % (name, diff))
    check(len(d["tensors"]) == len(GGUF_TYPES), "every type listed")


def main():
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        for fn in (mpq_writes_package_reads, package_writes_mpq_reads, quantized_checkpoint_opens,
                   gguf_package_writes_mpq_reads):
            try:
                fn(build, tmp)
            except Exception as e:  # a crash of a step is a failure, with its reason
                check(False, "%s raised %r" % (fn.__name__, e))
    from importlib.metadata import version
    print("interop (safetensors %s, gguf %s, numpy %s): %d passed, %d failed"
          % (safetensors.__version__, version("gguf"), np.__version__, passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
