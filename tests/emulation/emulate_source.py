#!/usr/bin/env python3
"""Rewrites a generated kernel source (`kdajit show KEY`) into a C++ file that
runs on the CPU under cuda_on_cpu.hpp: every inline PTX statement becomes the
emulation's call (a statement it does not know throws when reached), the
dynamic shared memory is the CTA's buffer, and the kernel is a function of a
namespace of its own, registered under the program's name (route twopass's
intra-chunk kernel under "<program>#pre", its norm kernel under "<program>#post").

    emulate_source.py KEY SOURCE OUT
"""
import re
import sys

# PTX text of the statement -> its C++ (the names are the template's own).
REWRITES = [
    ("cvt.rn.tf32.f32", "u = ::kdajit::emu::tf32_rn(x);"),
    ("mma.sync.aligned.m16n8k8", "::kdajit::emu::mma_m16n8k8_tf32(c, a0, a1, a2, a3, b0, b1);"),
    ("cvt.rn.bf16x2.f32", "r = static_cast<unsigned>(::kdajit::emu::bf16_rn(lo)) | "
                          "(static_cast<unsigned>(::kdajit::emu::bf16_rn(hi)) << 16);"),
    ("cvt.rn.bf16.f32", "r = ::kdajit::emu::bf16_rn(f);"),
    # The prefill kernels' exp_ftz and rcp_ftz (the hardware's approximations; here exact).
    ("ex2.approx.ftz.f32", "y = std::exp2(t);"),
    ("rcp.approx.ftz.f32", "y = 1.0f / x;"),
    ("griddepcontrol.", ""),
    ("ld.global.u16", "v = *src;"),
    ("@p st.shared.u16", "if (when) *dst = v;"),
    ("@p st.shared.f32", "if (when) *dst = v;"),
    ("%%cluster_ctarank", "r = static_cast<unsigned>(::kdajit::emu::cluster_rank());"),
    ("barrier.cluster.arrive", "::kdajit::emu::cluster_arrive();"),
    ("barrier.cluster.wait", "::kdajit::emu::cluster_wait();"),
    ("mapa.shared::cluster", "remote = 0;"),
    ("st.shared::cluster.f32", "*static_cast<float*>(::kdajit::emu::cluster_peer(local, rank)) = v;"),
    ("%%tid.x", "t = threadIdx.x;"),
    # cp.async (staged inputs, zeros when not `copy`; route pipe16's β words and gate rows):
    # each thread's copies land later, at random or at its wait (cuda_on_cpu).
    ("cp.async.cg.shared.global [%0], [%1], 16, %2", "::kdajit::emu::cp_async(dst, copy ? src : nullptr, 16);"),
    ("cp.async.cg.shared.global", "::kdajit::emu::cp_async(dst, src, 16);"),
    ("cp.async.ca.shared.global [%0], [%1], 4;", "::kdajit::emu::cp_async(dst, src, 4);"),
    ("cp.async.commit_group", "::kdajit::emu::cp_async_commit();"),
    ("cp.async.wait_group 1", "::kdajit::emu::cp_async_wait(1);"),
    ("cp.async.wait_all", "::kdajit::emu::cp_async_commit(); ::kdajit::emu::cp_async_wait(0);"),
    # An L2 prefetch (route twopass's next unit): a hint, nothing to do.
    ("cp.async.bulk.prefetch.L2", "(void)lo; (void)hi;"),
    # Route twopass's unit copies by the bulk copy engine, on an mbarrier.
    ("cp.async.bulk.shared::cluster.global.mbarrier", "::kdajit::emu::bulk_copy(dst, src, bytes, bar);"),
    ("mbarrier.init.shared::cta.b64", "::kdajit::emu::mbar_init(bar, arrivals);"),
    ("fence.mbarrier_init", ""),
    ("mbarrier.arrive.expect_tx.shared::cta.b64 _,", "::kdajit::emu::mbar_arrive_expect_tx(bar, bytes);"),
    ("mbarrier.try_wait.parity.shared::cta.b64", "::kdajit::emu::mbar_wait(bar, parity);"),
    ("fence.proxy.async.shared::cta", ""),
    # Route pipe16: its roles' named barriers and their mbarrier arrivals.
    ("bar.red.and.pred", "r = ::kdajit::emu::named_barrier(kId, static_cast<int>(kThreads), p ? 1 : 0);"),
    ("bar.sync", "::kdajit::emu::named_barrier(kId, static_cast<int>(kThreads), 1);"),
    ("mbarrier.arrive.shared::cta.b64 _,", "::kdajit::emu::mbar_arrive_expect_tx(bar, 0);"),
    # Step 5 on wgmma (sm_90a: route twopass at P <= 2, rowcta, rowcta16): done at once, a warpgroup's
    # 128 threads meeting at each instruction; the fence, the commit and the
    # wait have nothing left to order.
    ("wgmma.mma_async.sync.aligned.m64n16k8", "::kdajit::emu::wgmma_tf32(&d[0][0], 16, a0, a1, a2, a3, desc);"),
    ("wgmma.mma_async.sync.aligned.m64n64k8", "::kdajit::emu::wgmma_tf32(&d[0][0], 64, a0, a1, a2, a3, desc);"),
    ("wgmma.mma_async.sync.aligned.m64n128k8", "::kdajit::emu::wgmma_tf32(&d[0][0], 128, a0, a1, a2, a3, desc);"),
    ("wgmma.fence.sync.aligned", ""),
    ("wgmma.commit_group.sync.aligned", ""),
    ("wgmma.wait_group.sync.aligned", ""),
]


def asm_statements(text):
    """(start, end) of each `asm [volatile] ( ... );` statement."""
    for m in re.finditer(r"\basm\s*(?:volatile\s*)?\(", text):
        i, depth = m.end(), 1
        while depth:
            c = text[i]
            if c == '"':
                i += 1
                while text[i] != '"':
                    i += 2 if text[i] == "\\" else 1
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            i += 1
        while text[i] != ";":
            i += 1
        yield m.start(), i + 1


def rewrite(text):
    out, last = [], 0
    for start, end in asm_statements(text):
        stmt = text[start:end]
        out.append(text[last:start])
        if re.match(r'asm\s*(?:volatile\s*)?\(\s*""', stmt):
            # An empty statement (pin_accumulator): it only orders the
            # compiler's reads of its operands; nothing to do here.
            out.append(";")
            last = end
            continue
        for ptx, cpp in REWRITES:
            if ptx in stmt:
                out.append(cpp)
                break
        else:
            first = re.search(r'"([^"]*)"', stmt).group(1)[:48].replace("\\", "")
            out.append(f'::kdajit::emu::unsupported("{first}");')
        last = end
    out.append(text[last:])
    return "".join(out)


def main():
    key, src, dst = sys.argv[1:4]
    text = open(src).read()
    shared = "extern __shared__ __align__(16) unsigned char kda_smem[];"
    if shared not in text:
        sys.exit(f"{src}: no `{shared}`: the emulation knows the prefill template's kernel only")
    text = text.replace(shared, "unsigned char* kda_smem = ::kdajit::emu::dynamic_smem();")
    text = text.replace('extern "C" ', "")
    # The program's name (the source's first line): what the kernel is found
    # by, since keys that differ only in fields the program reads at run time
    # (heads, state dtype, conv layout) are one program.
    first = re.match(r"// kdajit kernel (\S+)\n", text)
    if not first:
        sys.exit(f"{src}: no `// kdajit kernel <program>` first line")
    program = first.group(1)
    ident = re.sub(r"[^A-Za-z0-9]", "_", key)
    with open(dst, "w") as f:
        f.write(f"// Generated by tests/emulation/emulate_source.py from `kdajit show {key}`. Do not edit.\n")
        f.write("#include <stdint.h>\n#include <cstring>\n#include \"cuda_on_cpu.hpp\"\n")
        f.write(f"namespace kdajit::emu::{ident} {{\n")
        f.write(rewrite(text))
        f.write("\nvoid entry(const void* params) {\n  KdaParams p;\n  std::memcpy(&p, params, sizeof p);\n"
                "  KDA_PREFILL_ENTRY(p);\n}\n")
        f.write(f"const bool registered = ::kdajit::emu::register_kernel(\"{program}\", &entry, sizeof(KdaParams));\n")
        # Route twopass: its intra-chunk kernel too, as "<program>#pre".
        f.write("#if KDA_TWOPASS\nvoid pre_entry(const void* params) {\n  KdaParams p;\n"
                "  std::memcpy(&p, params, sizeof p);\n  KDA_INTRA_ENTRY(p);\n}\n")
        f.write(f"const bool registered_pre = ::kdajit::emu::register_kernel(\"{program}#pre\", &pre_entry, "
                "sizeof(KdaParams));\n")
        # And, for the prefill op, its norm kernel, as "<program>#post".
        f.write("#if !KDA_CHUNK\nvoid post_entry(const void* params) {\n  KdaParams p;\n"
                "  std::memcpy(&p, params, sizeof p);\n  kda_prefill_norm(p);\n}\n")
        f.write(f"const bool registered_post = ::kdajit::emu::register_kernel(\"{program}#post\", &post_entry, "
                "sizeof(KdaParams));\n#endif\n#endif\n")
        f.write(f"}}  // namespace kdajit::emu::{ident}\n")


if __name__ == "__main__":
    main()
