"""PyTorch's own low-bit products on the GPU, timed the way bench_gemv_cuda
times mpq, for the rows the CUDA benchmark cannot make itself:

    python3 bench/torch_peers.py [--shapes 8192x8192,...] [--batches 1,16,...] [--reps R]

- int4: torch._weight_int4pack_mm, the 4-bit weight-only kernel (groups of
  128, bf16 scales and zeros, bf16 activations) that torchao's int4
  weight-only quantization calls;
- fp8: torch._scaled_mm, e4m3 weights and activations, unit scales, bf16
  out (cuBLASLt underneath, as bench_gemv_cuda --fp8 calls it directly: the
  two should agree), the batch rounded up to a multiple of 16 as
  _scaled_mm requires;
- fp16: torch.mm on fp16 weights, the common baseline.

Each time is the median over `reps` runs of 20 products timed with CUDA
events, the products rotating over enough copies of the weights that the
L2 cannot hold them (as bench_gemv_cuda does). Random weights and
activations, never zeros. A product the card or this PyTorch does not have
prints "-" and the reason on stderr. Output: one line per shape and batch,
microseconds per product.
"""
import argparse
import statistics
import sys


def timed(fn, copies, reps):
    """Median microseconds per call of fn(k) over reps runs of 20 calls."""
    import torch

    for k in range(3):
        fn(k % copies)
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out, call = [], 0
    for _ in range(reps):
        t0.record()
        for _ in range(20):
            fn(call % copies)
            call += 1
        t1.record()
        t1.synchronize()
        out.append(t0.elapsed_time(t1) * 1e3 / 20)
    return statistics.median(out)


def copies_for(nbytes):
    return int(200e6 / nbytes) + 2


def int4_weights(m, n, group, copies):
    """Packed int4 weights (m output rows, n inputs) and their bf16 scales and zeros."""
    import torch

    out = []
    for _ in range(copies):
        q = torch.randint(0, 16, (m, n), dtype=torch.int32, device="cuda")
        packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        w = torch._convert_weight_to_int4pack(packed, 8)
        sz = torch.empty(n // group, m, 2, dtype=torch.bfloat16, device="cuda")
        sz[..., 0].uniform_(0.001, 0.01)
        sz[..., 1].uniform_(-0.05, 0.05)
        out.append((w, sz))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8192x8192,28672x8192,8192x28672")
    ap.add_argument("--batches", default="1,2,16,32,64,128,256,1024")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    import torch  # after the arguments, so that --help needs no torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'shape':<12} {'batch':>5} {'fp16 us':>9} {'int4 us':>9} {'fp8 us':>9}")
    for m, n in shapes:
        c16 = copies_for(2 * m * n)
        w16 = [torch.randn(m, n, dtype=torch.float16, device="cuda") * 0.02 for _ in range(c16)]
        try:
            c4 = copies_for(m * n // 2)
            w4 = int4_weights(m, n, 128, c4)
        except Exception as e:  # no int4 kernel in this build or for this card
            print(f"int4: {e}", file=sys.stderr)
            w4 = None
        try:
            c8 = copies_for(m * n)
            w8 = [torch.randn(m, n, device="cuda").mul_(0.02).to(torch.float8_e4m3fn) for _ in range(c8)]
            one = torch.ones((), device="cuda")
        except Exception as e:
            print(f"fp8: {e}", file=sys.stderr)
            w8 = None
        for b in batches:
            x16 = torch.randn(b, n, dtype=torch.float16, device="cuda")
            row = [timed(lambda k: torch.mm(x16, w16[k].t()), c16, a.reps)]
            if w4 is not None:
                xb = x16.to(torch.bfloat16)
                try:
                    row.append(timed(lambda k: torch._weight_int4pack_mm(xb, w4[k][0], 128, w4[k][1]), c4, a.reps))
                except Exception as e:
                    print(f"int4, batch {b}: {e}", file=sys.stderr)
                    row.append(None)
            else:
                row.append(None)
            if w8 is not None:
                # _scaled_mm wants the second operand column-major and dimensions of multiples of 16
                x8 = torch.randn((b + 15) // 16 * 16, n, device="cuda").to(torch.float8_e4m3fn)
                try:
                    row.append(
                        timed(lambda k: torch._scaled_mm(x8, w8[k].t(), scale_a=one, scale_b=one,
                                                         out_dtype=torch.bfloat16), c8, a.reps))
                except Exception as e:
                    print(f"fp8, batch {b}: {e}", file=sys.stderr)
                    row.append(None)
            else:
                row.append(None)
            cells = " ".join(f"{v:9.2f}" if v is not None else f"{'-':>9}" for v in row)
            print(f"{m}x{n:<7} {b:5d} {cells}", flush=True)
        del w16, w4, w8
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
