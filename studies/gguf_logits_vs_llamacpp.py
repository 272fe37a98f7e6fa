"""Logits parity with llama.cpp on the same GGUF file: both engines, the same token ids.

    python -m studies.gguf_logits_vs_llamacpp [--llamacpp /work/peers/llama.cpp] [--model DIR] [--prompts 8]
        [--llamacpp-kv f16|f32] [--llamacpp-flash-attn auto|off]

Our side: the reference engine with ``load_format="gguf"`` (the file's blocks, csrc/quant_gguf.cpp),
float32 activations. llama.cpp's side: a ~60-line C++ program of ours, compiled here against the
peer's ``llama.h`` / ``libllama`` (studies/llamacpp_build.sh; a peer, never a dependency), that
(a) runs each sequence in one batch with every position's logits out and (b) decodes greedily.
Its KV cache type and flash attention are its defaults (f16, auto: on for CPUs) unless the options
ask for float32 and its unfused attention, the settings nearest to ours (float32 cache, float32 softmax).

Inputs: ``--prompts`` held-out sequences (the Apache-2.0 licence text cut into ``--len`` tokens each,
our tokenizer's ids, so both engines see identical ids). Figures:
  * teacher-forced: for every position after the first ``--prefix`` tokens, the full-vocabulary
    log-softmax rows of both engines: max |difference| over all rows and tokens, and how often the
    argmax agrees. (Log-probabilities, not raw logits: our scoring path returns log-softmax rows;
    the two differ by one constant per row.)
  * greedy: ``--gen`` tokens from chat prompts in each engine: identical sequences or not.
``gguf_logits_parity_with_llamacpp`` is true when every greedy sequence is identical and the
teacher-forced argmax agrees everywhere. Merged into results/perf/summary.json with
``gguf_logprob_max_abs_diff_vs_llamacpp`` beside it; the details go to results/quant/logits_parity.json.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import tempfile
from pathlib import Path

import torch

from benchmarks.lib.records import command_line, write_json

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r"""
// argv: model.gguf in.bin out.bin threads kv fa (kv: 0 llama.cpp's default f16 cache, 1 float32; fa: its
// flash_attn_type, -1 auto (its default), 0 off). in.bin: int32 mode, n_seq, then per sequence int32 n, n ids
// (mode 0: all-position logits out, float32 [n, V] per sequence; mode 1: int32 gen, greedy ids out).
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>

static int32_t rd(FILE* f) { int32_t v; if (fread(&v, 4, 1, f) != 1) exit(3); return v; }

int main(int argc, char** argv) {
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) return 2;
  const int32_t V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  FILE* in = fopen(argv[2], "rb");
  FILE* out = fopen(argv[3], "wb");
  const int32_t mode = rd(in), n_seq = rd(in), gen = rd(in);
  for (int32_t s = 0; s < n_seq; ++s) {
    const int32_t n = rd(in);
    std::vector<llama_token> ids(n);
    for (auto& t : ids) t = rd(in);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + gen + 8; cp.n_batch = cp.n_ubatch = n + 8;
    cp.n_threads = cp.n_threads_batch = atoi(argv[4]);
    if (atoi(argv[5]) == 1) { cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; }
    cp.flash_attn_type = static_cast<llama_flash_attn_type>(atoi(argv[6]));
    llama_context* ctx = llama_init_from_model(model, cp);
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int32_t i = 0; i < n; ++i) {
      b.token[i] = ids[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = mode == 0 || i == n - 1;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b)) return 4;
    if (mode == 0) {
      for (int32_t i = 0; i < n; ++i) fwrite(llama_get_logits_ith(ctx, i), 4, V, out);
    } else {
      llama_token next = 0;
      for (int32_t g = 0; g < gen; ++g) {
        const float* l = llama_get_logits_ith(ctx, -1);
        next = 0;
        for (int32_t v = 1; v < V; ++v) if (l[v] > l[next]) next = v;
        fwrite(&next, 4, 1, out);
        llama_batch one = llama_batch_get_one(&next, 1);
        if (llama_decode(ctx, one)) return 5;
      }
    }
    llama_batch_free(b);
    llama_free(ctx);
  }
  fclose(out);
  llama_model_free(model);
  return 0;
}
"""


def build(llamacpp: Path, work: Path) -> Path:
    src, exe = work / "logits.cpp", work / "logits"
    src.write_text(PROGRAM)
    lib = llamacpp / "build" / "bin"
    subprocess.run(["g++", "-O2", "-std=c++17", str(src), "-I", str(llamacpp / "include"),
                    "-I", str(llamacpp / "ggml" / "include"), "-L", str(lib), "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    return exe


def run_llamacpp(exe: Path, gguf: Path, work: Path, mode: int, seqs: list[list[int]], gen: int,
                 threads: int, kv: str, flash_attn: str) -> bytes:
    inp, out = work / f"in{mode}.bin", work / f"out{mode}.bin"
    data = struct.pack("<3i", mode, len(seqs), gen)
    for s in seqs:
        data += struct.pack(f"<{len(s) + 1}i", len(s), *s)
    inp.write_bytes(data)
    fa = {"auto": "-1", "off": "0"}[flash_attn]
    subprocess.run([str(exe), str(gguf), str(inp), str(out), str(threads), "1" if kv == "f32" else "0", fa], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out.read_bytes()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llamacpp", type=Path, default=Path("/work/peers/llama.cpp"))
    ap.add_argument("--model", default=None, help="model directory holding a GGUF (default: the embedded model)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--len", type=int, default=128, help="tokens per teacher-forced sequence")
    ap.add_argument("--prefix", type=int, default=8, help="positions not compared at the start of each")
    ap.add_argument("--gen", type=int, default=32, help="greedy tokens per chat prompt")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llamacpp-kv", choices=["f16", "f32"], default="f16",
                    help="llama.cpp's KV cache type (f16: its default; f32: as ours, float32)")
    ap.add_argument("--llamacpp-flash-attn", choices=["auto", "off"], default="auto",
                    help="llama.cpp's flash attention (auto: its default, on for CPUs; off: its unfused attention)")
    ap.add_argument("--no-summary", action="store_true", help="print only, merge nothing")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from modelkit.models import resolve_model
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.quant import find_gguf
    from refengine.sampling_params import SamplingParams

    model_dir = Path(args.model) if args.model else resolve_model("default")
    gguf = find_gguf(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = Path("/usr/share/common-licenses/Apache-2.0").read_text()
    ids = tok(text)["input_ids"]
    seqs = [ids[i * args.len:(i + 1) * args.len] for i in range(args.prompts)]
    assert all(len(s) == args.len for s in seqs), "the licence text is too short for --prompts x --len"
    questions = ["What is the capital of France?", "Write a haiku about the sea.", "List three fruits.",
                 "Explain what a compiler does.", "Who wrote Hamlet?", "Give me a tip for learning Python.",
                 "What is 12 times 7?", "Describe a cat in one sentence."]
    chats = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
             for q in (questions * (args.prompts // len(questions) + 1))[:args.prompts]]

    torch.set_num_threads(args.threads)
    eng = LLMEngine(EngineConfig(model=str(model_dir), load_format="gguf", dtype="float32",
                                 max_model_len=max(args.len, 512) + args.gen, num_kv_blocks=512, max_num_seqs=8))
    ours_rows = eng.score([(s[:args.prefix], s[args.prefix:]) for s in seqs], want_dist=True)
    # the same file dequantized, float32 activations: what each engine's quantized activations cost
    dense_rows = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", max_model_len=max(args.len, 512),
                                        num_kv_blocks=128)).score([(s[:args.prefix], s[args.prefix:]) for s in seqs])
    ours_gen = [eng.generate([c], SamplingParams(max_tokens=args.gen, temperature=0, ignore_eos=True))[0]
                for c in chats]

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build(args.llamacpp, work)
        opts = (args.threads, args.llamacpp_kv, args.llamacpp_flash_attn)
        raw = run_llamacpp(exe, gguf, work, 0, seqs, 0, *opts)
        theirs_gen_raw = run_llamacpp(exe, gguf, work, 1, chats, args.gen, *opts)
    V = len(raw) // 4 // (args.len * args.prompts)
    theirs = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(args.prompts, args.len, V)
    theirs_gen = torch.frombuffer(bytearray(theirs_gen_raw), dtype=torch.int32).reshape(args.prompts, args.gen).tolist()

    max_diff, agree, total, ours_vs_dense, theirs_vs_dense, ours_vs_theirs = 0.0, 0, 0, 0.0, 0.0, 0.0
    for s, rows in enumerate(ours_rows):
        ref = torch.log_softmax(theirs[s, args.prefix - 1:args.len - 1].double(), dim=-1)   # predicts s[prefix:]
        got = torch.stack([r[2] for r in rows]).double()[:, :V]
        true = torch.tensor(seqs[s][args.prefix:]).unsqueeze(1)
        dense = torch.tensor([r[0] for r in dense_rows[s]], dtype=torch.float64)
        ours_vs_dense += float((got.gather(1, true).squeeze(1) - dense).abs().sum())
        theirs_vs_dense += float((ref.gather(1, true).squeeze(1) - dense).abs().sum())
        ours_vs_theirs += float((got.gather(1, true) - ref.gather(1, true)).abs().sum())
        max_diff = max(max_diff, (got - ref).abs().max().item())
        agree += int((got.argmax(-1) == ref.argmax(-1)).sum())
        total += ref.shape[0]
    same_gen = [a == b for a, b in zip(ours_gen, theirs_gen)]
    parity = all(same_gen) and agree == total
    res = {"command": command_line(), "gguf": gguf.name, "llamacpp_kv_cache": args.llamacpp_kv,
           "llamacpp_flash_attn": args.llamacpp_flash_attn, "sequences": args.prompts, "tokens_per_sequence": args.len,
           "compared_positions": total, "argmax_agreement": agree / total,
           "logprob_max_abs_diff": max_diff,
           "true_logprob_mean_abs_diff": ours_vs_theirs / total,
           # mean |log p(true token)| difference from the dequantized float32 model (the same weights)
           "ours_true_logprob_mean_abs_diff_vs_dense": ours_vs_dense / total,
           "llamacpp_true_logprob_mean_abs_diff_vs_dense": theirs_vs_dense / total, "greedy_prompts": args.prompts, "greedy_tokens": args.gen,
           "greedy_identical": sum(same_gen), "parity": parity}
    print(json.dumps(res, indent=1))
    if args.no_summary:
        return
    write_json(ROOT / "results" / "quant" / "logits_parity.json", res)
    path = ROOT / "results" / "perf" / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    summary.update({"gguf_logits_parity_with_llamacpp": parity, "gguf_logprob_max_abs_diff_vs_llamacpp": max_diff})
    write_json(path, summary)


if __name__ == "__main__":
    main()
