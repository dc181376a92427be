"""python -m aot_build --out build/generated [--jobs N] [--list]

Compiles the variant grid (narrowed by FATTN_CUDA_ARCHS / FATTN_HEAD_DIMS) in
parallel, with a progress line per variant, and writes the generated table (with the
PTX of the archs FATTN_PTX_ARCHS names).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from . import compress, emit, grid
from .compiler import BuildError, _kernel_source_digest, compile_variant, default_cache_dir


def _compile_job(args):
    return compile_variant(*args)


def build(out_dir: Path, jobs: int | None = None, cache_dir: Path | None = None,
          env: dict | None = None, log=print, stats: dict | None = None) -> dict:
    """Builds the grid into out_dir and returns its manifest; `stats`, if given, receives
    the counts of compiled and cached variants and the seconds taken (for a summary)."""
    import triton

    config = grid.load_config()
    variants = grid.expand(config, env)
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    digest = _kernel_source_digest()
    jobs = jobs or int(os.environ.get("FATTN_BUILD_JOBS", 0)) or os.cpu_count() or 1
    limits = config["shared_memory_limit"]
    packing = compress.mode(env)
    archs = sorted({v.arch for v in variants})
    with_ptx = grid.ptx_archs(archs, env, grid.served_archs(config, archs))
    log(f"aot_build: {len(variants)} variants, {jobs} jobs, triton {triton.__version__}, "
        f"images {'compressed fatbinaries' if packing == 'fatbinary' else 'raw (uncompressed)'}, "
        f"PTX for {', '.join(f'sm_{a}' for a in with_ptx) or 'no arch'} (FATTN_PTX_ARCHS), cache {cache_dir}")
    started = time.time()
    results, errors = {}, []
    job_args = [(v, limits[str(v.arch)], cache_dir, digest, packing) for v in variants]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_compile_job, a): i for i, a in enumerate(job_args)}
        for done, fut in enumerate(as_completed(futures), 1):
            i = futures[fut]
            try:
                art = fut.result()
            except BuildError as e:
                errors.append(str(e))
                log(f"[{done}/{len(variants)}] FAILED {variants[i].label}")
                continue
            except Exception as e:  # a Triton compile error: name the variant
                errors.append(f"{variants[i].label}: {type(e).__name__}: {e}")
                log(f"[{done}/{len(variants)}] FAILED {variants[i].label}")
                continue
            results[i] = art
            how = "cached" if art.cached else f"{art.seconds:.1f}s"
            log(f"[{done}/{len(variants)}] {variants[i].label}  shared={art.meta['shared']}  {how}")
    if errors:
        raise BuildError("aot_build failed:\n  " + "\n  ".join(errors))
    manifest = emit.write([results[i] for i in range(len(variants))], out_dir, triton.__version__, config, packing,
                          with_ptx)
    fresh = sum(1 for a in results.values() if not a.cached)
    seconds = time.time() - started
    log(f"aot_build: wrote {out_dir} ({len(variants)} variants, {fresh} compiled, "
        f"{len(variants) - fresh} from cache, blob {manifest['blob_size'] / 2**20:.1f} MiB, "
        f"{sum(len(a.cubin) + len(a.ptx) for a in results.values()) / 2**20:.1f} MiB raw) "
        f"in {seconds:.1f}s")
    if stats is not None:
        stats.update(compiled=fresh, from_cache=len(variants) - fresh, seconds=seconds)
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aot_build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/generated"))
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: $FATTN_BUILD_JOBS or the CPU count)")
    parser.add_argument("--cache", type=Path, default=None, help="cache folder (default: $FATTN_AOT_CACHE or build/aot_cache)")
    parser.add_argument("--list", action="store_true", help="print the variant grid and exit")
    args = parser.parse_args(argv)
    try:
        if args.list:
            for v in grid.expand():
                print(v.label)
            return 0
        build(args.out, args.jobs, args.cache, log=lambda m: print(m, flush=True))
    except (grid.GridError, BuildError, compress.CompressError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
