"""Trains fmoe-tiny, the small MoE language model bundled as fmoe's default model.

    python datasets/train-fmoe-tiny/train.py [--out datasets/fmoe-tiny] [--minutes 35]
        [--threads 1] [--random-init-out DIR] [--corpus-dir DIR] [--seed 0]

What it does, top to bottom:

1. Corpus. The reStructuredText sources of the Python 3.11 documentation as Debian's
   `python3.11-doc` package installs them (/usr/share/doc/python3.11/html/_sources/),
   licensed under the PSF License Agreement (version 2); the code examples in the
   documentation are also under the Zero-Clause BSD licence (see the docs' license.html
   and /usr/share/doc/python3.11-doc/copyright). The markup is lightly stripped to prose
   (roles, directives, section underlines). About 2% of the files, chosen by a hash of
   their path, are held out for validation. A quarter of the training sections that have
   a title are also given as ChatML exchanges ("<|im_start|>user\\nTell me about
   {title}.<|im_end|>\\n<|im_start|>assistant\\n{section}<|im_end|>"), so that the chat
   template fmoe applies with --chat leads somewhere and the model learns to end a turn.
2. Tokenizer. A byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer with its regex,
   ByteLevel decoder) trained with HuggingFace `tokenizers` to a vocabulary of 4096, with
   special tokens <|endoftext|>, <|im_start|>, <|im_end|>; tokenizer_config.json carries a
   ChatML chat template (fmoe renders it as its "chatml" family).
3. Model. transformers' Qwen3-MoE (q/k RMSNorm per head, softmax router, top-k
   renormalised): 6 layers, hidden 256, 4 query heads of 64 over 2 KV heads, 8 experts of
   intermediate size 176 per layer, top-2, tied embeddings, context 1024. About 8.8M
   parameters, 17.5 MB in bf16.
4. Training. AdamW on random 256-token windows of the token stream (documents separated
   by <|endoftext|>), batch 16, with transformers' load-balancing loss (coefficient 0.01)
   so that experts share the work. The schedule runs on wall-clock time: linear warm-up
   then cosine decay over --minutes, so the run fits the time budget on any machine.
5. Report. Validation loss and per-layer routing entropy (mean entropy of the gate
   distribution, and entropy of the expert-usage histogram) of the trained model, of the
   saved bf16 checkpoint reloaded, and of the same architecture at random init, written
   to datasets/train-fmoe-tiny/last_run.json. With --random-init-out the random-init model is
   saved too (for comparing fmoe traces; never committed).

Dependencies: torch, transformers, tokenizers (tests/python/requirements-torch.txt).
"""
import argparse
import glob
import hashlib
import json
import math
import os
import random
import re
import sys
import time

CORPUS_DIR = "/usr/share/doc/python3.11/html/_sources"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB = 4096
SEQ = 256
BATCH = 16
CONTEXT = 1024

MODEL_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=176,
    num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
    mlp_only_layers=[], max_position_embeddings=CONTEXT, rope_theta=10000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, router_aux_loss_coef=0.01,
    initializer_range=0.02, hidden_act="silu", attention_bias=False,
)

# ---------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------

# Directives whose indented body is markup or metadata, not prose: dropped with the body.
DROP_BLOCK = {"index", "toctree", "testsetup", "testcleanup", "only", "raw", "highlight",
              "tabularcolumns", "productionlist", "include", "literalinclude", "image",
              "figure", "csv-table", "list-table", "table", "audit-event-table", "opcode",
              "program", "cmdoption-table", "availability", "impl-detail", "glossary"}
# Directives whose line is dropped but whose body is kept (metadata on one line).
DROP_LINE = {"module", "currentmodule", "moduleauthor", "sectionauthor", "versionadded",
             "versionchanged", "deprecated", "deprecated-removed", "seealso", "note",
             "warning", "tip", "important", "caution", "hint", "attention", "danger",
             "admonition", "rubric", "topic", "sidebar", "centered", "hlist", "doctest",
             "testcode", "testoutput", "code-block", "sourcecode", "code", "audit-event",
             "c:namespace", "py:currentmodule", "contents", "sectionauthor"}
LABELS = {"versionadded": "New in version {}.", "versionchanged": "Changed in version {}.",
          "deprecated": "Deprecated since version {}.", "note": "Note:", "warning": "Warning:",
          "seealso": "See also:"}

ROLE = re.compile(r":[\w:+-]+:`(?:~|!)?([^`<]*?)(?:\s*<[^`>]*>)?`")
LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`_{1,2}")
REF = re.compile(r"`([^`]+)`_{1,2}")
LITERAL = re.compile(r"``(.+?)``")
EMPH = re.compile(r"\*\*(.+?)\*\*|\*(\S.*?)\*")
DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$")
UNDERLINE = re.compile(r"^\s*([=\-~^\"'`#*+.:_])\1{2,}\s*$")


def inline(s):
    s = ROLE.sub(lambda m: m.group(1).strip(), s)
    s = LINK.sub(r"\1", s)
    s = LITERAL.sub(r"\1", s)
    s = REF.sub(r"\1", s)
    s = EMPH.sub(lambda m: m.group(1) or m.group(2), s)
    return s.replace("\\ ", "")


def clean_rst(text):
    """reST to prose: returns a list of (title, body) sections."""
    lines = text.split("\n")
    out, skip_indent = [], None
    for i, line in enumerate(lines):
        ind = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if line.strip() == "" or ind > skip_indent:
                continue
            skip_indent = None
        m = DIRECTIVE.match(line)
        if m:
            name, arg = m.group(2).lower(), m.group(3).strip()
            if name in DROP_BLOCK:
                skip_indent = len(m.group(1))
                continue
            if name in LABELS:
                out.append(m.group(1) + LABELS[name].format(arg.split()[0] if arg else "")
                           .replace(" .", "."))
                continue
            if name in DROP_LINE:
                if name == "rubric" and arg:
                    out.append(m.group(1) + inline(arg))
                continue
            # function, method, class, data, attribute, c:function, describe, ...
            if arg:
                out.append(m.group(1) + inline(arg))
            continue
        if line.lstrip().startswith(".. "):  # comments, targets, substitutions
            skip_indent = ind
            continue
        if UNDERLINE.match(line):
            continue
        s = inline(line.rstrip())
        if s.endswith("::"):
            s = s[:-2].rstrip()
            s = s + ":" if s else s
        out.append(s)
    # Sections: a line followed by an underline in the source became a line followed by
    # nothing; recover titles from the source instead.
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    titles = set()
    for i in range(len(lines) - 1):
        if lines[i].strip() and UNDERLINE.match(lines[i + 1]) and \
                len(lines[i + 1].strip()) >= len(lines[i].strip()) - 2:
            titles.add(inline(lines[i].strip()))
    sections, title, body = [], None, []
    for line in text.split("\n"):
        if line.strip() in titles:
            if body:
                sections.append((title, "\n".join(body).strip()))
            title, body = line.strip(), []
        else:
            body.append(line)
    if body:
        sections.append((title, "\n".join(body).strip()))
    return [(t, b) for t, b in sections if b]


def is_validation(path):
    return hashlib.sha256(path.encode()).digest()[0] < 10  # about 4% of the files


def load_corpus(corpus_dir, seed):
    files = sorted(glob.glob(os.path.join(corpus_dir, "**", "*.rst.txt"), recursive=True))
    if not files:
        sys.exit(f"train.py: no *.rst.txt under {corpus_dir}: apt-get install python3.11-doc")
    rng = random.Random(seed)
    train, val, chats = [], [], 0
    for f in files:
        rel = os.path.relpath(f, corpus_dir)
        with open(f, encoding="utf-8") as fh:
            sections = clean_rst(fh.read())
        doc = "\n\n".join((t + "\n\n" if t else "") + b for t, b in sections)
        if is_validation(rel):
            val.append(doc)
            continue
        train.append(doc)
        for t, b in sections:
            if t and len(b) > 200 and rng.random() < 0.25:
                ask = rng.choice(["Tell me about {}.", "What is {}?", "Explain {}.",
                                  "Can you describe {}?", "{}"]).format(t)
                train.append(f"<|im_start|>user\n{ask}<|im_end|>\n"
                             f"<|im_start|>assistant\n{b[:2000]}<|im_end|>\n")
                chats += 1
    return files, train, val, chats


# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------

def train_tokenizer(texts, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CONTEXT,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False,
                                          "special": True} for s, i in ids.items()},
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return tok, ids


# ---------------------------------------------------------------------------------------
# Model, evaluation
# ---------------------------------------------------------------------------------------

def make_model(ids, torch, transformers):
    cfg = transformers.Qwen3MoeConfig(**MODEL_CONFIG, bos_token_id=None,
                                      eos_token_id=ids["<|endoftext|>"],
                                      pad_token_id=ids["<|endoftext|>"])
    cfg._attn_implementation = "sdpa"
    return transformers.Qwen3MoeForCausalLM(cfg)


def entropy(p, torch):
    return -(p * torch.log(p.clamp_min(1e-12))).sum(-1)


def evaluate(model, batches, torch):
    """Mean validation loss (nats/token) and per-layer routing statistics."""
    model.eval()
    J = model.config.num_experts
    L = model.config.num_hidden_layers
    loss_sum, n_tok = 0.0, 0
    gate_h = torch.zeros(L, dtype=torch.float64)
    usage = torch.zeros(L, J, dtype=torch.float64)
    with torch.no_grad():
        for x in batches:
            out = model(input_ids=x[:, :-1], output_router_logits=True)
            logits = out.logits.float()
            lp = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   x[:, 1:].reshape(-1), reduction="sum")
            loss_sum += float(lp)
            n_tok += x[:, 1:].numel()
            for l, r in enumerate(out.router_logits):
                p = torch.softmax(r.float(), -1)
                gate_h[l] += float(entropy(p, torch).sum())
                top = torch.topk(p, model.config.num_experts_per_tok, -1).indices
                usage[l] += torch.bincount(top.reshape(-1), minlength=J).double()
    model.train()
    ntok_route = n_tok
    u = usage / usage.sum(-1, keepdim=True)
    return {
        "loss": loss_sum / n_tok,
        "perplexity": math.exp(loss_sum / n_tok),
        "gate_entropy_bits": [float(v) / ntok_route / math.log(2) for v in gate_h],
        "usage_entropy_bits": [float(v) / math.log(2) for v in entropy(u, torch)],
        "max_entropy_bits": math.log2(J),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fmoe-tiny"))
    ap.add_argument("--minutes", type=float, default=35.0)
    # One thread by default: on a shared 2-core machine two OpenMP threads that spin while
    # waiting for each other ran 2.5x slower than one (measured while other jobs ran).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=50, help="warm-up steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--corpus-dir", default=CORPUS_DIR)
    ap.add_argument("--random-init-out", default=None)
    ap.add_argument("--report", default=os.path.join(os.path.dirname(__file__), "last_run.json"))
    a = ap.parse_args()

    # Idle OpenMP threads sleep instead of spinning (set before torch loads OpenMP).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import transformers

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    t_start = time.time()

    files, train_docs, val_docs, chats = load_corpus(a.corpus_dir, a.seed)
    print(f"corpus: {len(files)} files, {len(train_docs)} training documents "
          f"({chats} as chats), {len(val_docs)} validation documents, "
          f"{sum(map(len, train_docs)) / 1e6:.1f} MB training text", flush=True)
    tok, ids = train_tokenizer(train_docs, a.out)
    eot = ids["<|endoftext|>"]

    def stream(docs):
        out = []
        for enc in tok.encode_batch(docs):
            out.extend(enc.ids)
            out.append(eot)
        return torch.tensor(out, dtype=torch.long)

    train_ids = stream(train_docs)
    val_ids = stream(val_docs)
    print(f"tokens: {len(train_ids)} training, {len(val_ids)} validation "
          f"({sum(map(len, train_docs)) / len(train_ids):.2f} bytes/token)", flush=True)

    g = torch.Generator().manual_seed(a.seed + 1)
    nval = min(48, (len(val_ids) - 1) // (SEQ + 1))
    val_batches = [torch.stack([val_ids[i * (SEQ + 1):(i + 1) * (SEQ + 1)]
                                for i in range(b, min(b + 8, nval))])
                   for b in range(0, nval, 8)]

    model = make_model(ids, torch, transformers)
    model.train()
    nparams = sum(p.numel() for p in model.parameters())
    print(f"model: {nparams / 1e6:.2f}M parameters", flush=True)
    random_eval = evaluate(model, val_batches, torch)
    print(f"random init: val loss {random_eval['loss']:.3f}, gate entropy "
          f"{[round(v, 2) for v in random_eval['gate_entropy_bits']]} bits", flush=True)
    if a.random_init_out:
        save(model, a.random_init_out, a.out, ids, torch)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    budget = a.minutes * 60.0 - (time.time() - t_start) - 60.0  # leave time to save
    t0 = time.time()
    step, seen, history = 0, 0, []
    next_eval = t0 + 180.0
    warmup = a.warmup
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0:
            break
        lr = a.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, len(train_ids) - SEQ - 1, (BATCH,), generator=g)
        x = torch.stack([train_ids[s:s + SEQ + 1] for s in starts])
        out = model(input_ids=x[:, :-1], output_router_logits=True)
        logits = out.logits
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               x[:, 1:].reshape(-1))
        loss = ce + model.config.router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += BATCH * SEQ
        if step % 20 == 0:
            el = time.time() - t0
            print(f"step {step} tokens {seen} loss {float(ce.detach()):.3f} "
                  f"aux {float(out.aux_loss.detach()):.3f} "
                  f"lr {lr:.2e} {seen / el:.0f} tok/s {el / 60:.1f} min", flush=True)
        if time.time() >= next_eval:
            ev = evaluate(model, val_batches, torch)
            history.append({"step": step, "tokens": seen, "minutes": (time.time() - t0) / 60,
                            "train_loss": float(ce.detach()), "val_loss": ev["loss"]})
            print(f"eval step {step}: val loss {ev['loss']:.3f} gate entropy "
                  f"{[round(v, 2) for v in ev['gate_entropy_bits']]}", flush=True)
            next_eval = time.time() + 180.0
    train_minutes = (time.time() - t0) / 60

    trained_eval = evaluate(model, val_batches, torch)
    save(model, a.out, a.out, ids, torch)
    reloaded = transformers.Qwen3MoeForCausalLM.from_pretrained(a.out, dtype=torch.float32)
    bf16_eval = evaluate(reloaded, val_batches, torch)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out)
               if os.path.isfile(os.path.join(a.out, f)))
    report = {
        "corpus": {"source": a.corpus_dir, "files": len(files), "training_documents": len(train_docs),
                   "chat_documents": chats, "validation_documents": len(val_docs),
                   "training_tokens": len(train_ids), "validation_tokens": len(val_ids),
                   "validation_tokens_evaluated": nval * SEQ},
        "model": {"parameters": nparams, "config": MODEL_CONFIG, "directory_bytes": size},
        "training": {"steps": step, "tokens": seen, "minutes": train_minutes,
                     "epochs": seen / len(train_ids), "batch": BATCH, "seq": SEQ,
                     "lr": a.lr, "threads": a.threads, "seed": a.seed,
                     "torch": torch.__version__, "transformers": transformers.__version__},
        "random_init": random_eval, "trained_f32": trained_eval, "trained_bf16": bf16_eval,
        "history": history,
    }
    with open(a.report, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps({k: report[k] for k in ("random_init", "trained_bf16", "training")},
                     indent=1), flush=True)
    print(f"saved {a.out}: {size / 1e6:.2f} MB", flush=True)


def save(model, out, tok_dir, ids, torch):
    """Writes a bf16 copy of `model` (the training copy keeps its float32 weights)."""
    import copy
    import shutil

    os.makedirs(out, exist_ok=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    if os.path.abspath(out) != os.path.abspath(tok_dir):
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    gen = {"eos_token_id": [ids["<|endoftext|>"], ids["<|im_end|>"]],
           "pad_token_id": model.config.pad_token_id, "do_sample": False,
           "max_new_tokens": 128}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
