// llamacpp-bench.mjs measures a GGUF model with llama.cpp through the
// node-llama-cpp binding, on the CPU backend only, and prints one JSON
// object on stdout. scripts/bench-llamacpp.sh installs the binding and runs
// this; it can also be run by hand from a directory whose node_modules has
// node-llama-cpp:
//
//   node llamacpp-bench.mjs info  --model M.gguf
//   node llamacpp-bench.mjs greedy --model M.gguf --prompt-ids 1,2,3 --n 32 [--threads 2] [--top 5]
//   node llamacpp-bench.mjs forced --model M.gguf --ids 1,2,3,4,5 --from 3 [--threads 2]
//   node llamacpp-bench.mjs bench --model M.gguf [--threads 1,2] [--decode 128] [--prefill 512] [--reps 3]
//
// "greedy" generates --n tokens greedily after --prompt-ids; "forced" is
// teacher forcing: it evaluates all of --ids and reports llama.cpp's
// greedy choice after each of the positions from --from - 1 on, with how
// many equal the next id of --ids (the agreement with another engine's
// greedy output). Token ids are fed directly (no text tokenisation). "decode" is the rate
// of generating --decode tokens greedily after a one-token prompt (BOS),
// timed from the first generated token to the last; "prefill" is the rate
// of evaluating a --prefill-token prompt in one batch of that size. Each
// figure is the best of --reps runs after one warm-up run. llama.cpp's log
// lines naming the CPU backend it loaded go to stderr and into the
// "backend" field.
import process from "node:process";
import { performance } from "node:perf_hooks";

const mod = await import(process.env.NODE_LLAMA_CPP_MODULE || "node-llama-cpp");
const { getLlama, LlamaLogLevel } = mod;

function parseArgs(argv) {
  const out = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith("--")) {
      const k = a.slice(2);
      const v = argv[i + 1];
      if (v === undefined || v.startsWith("--")) {
        out[k] = true;
      } else {
        out[k] = v;
        i++;
      }
    } else {
      out._.push(a);
    }
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const mode = args._[0] || "bench";
if (!args.model) {
  console.error("usage: llamacpp-bench.mjs info|greedy|bench --model FILE.gguf [...]");
  process.exit(2);
}

const backendLines = [];
const llama = await getLlama({
  gpu: false,
  build: "never",
  skipDownload: true,
  logLevel: LlamaLogLevel.debug,
  logger(level, message) {
    const m = String(message).trim();
    if (/load_backend|ggml_backend_load|CPU backend|system_info|CPU :/i.test(m)) {
      backendLines.push(m);
      console.error(`[llama.cpp] ${m}`);
    } else if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) {
      console.error(`[llama.cpp ${level}] ${m}`);
    }
  },
});

const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0, useMmap: true });

function intList(s, dflt) {
  if (s === undefined || s === true) return dflt;
  return String(s).split(",").filter((x) => x !== "").map((x) => {
    const n = Number(x);
    if (!Number.isInteger(n)) throw new Error(`not an integer: ${x}`);
    return n;
  });
}

async function newSequence(threads, contextSize, batchSize) {
  const context = await model.createContext({
    contextSize,
    batchSize,
    threads: { ideal: threads, min: threads },
    sequences: 1,
  });
  return { context, sequence: context.getSequence() };
}

const bos = model.tokens.bos ?? 1;

async function decodeRate(threads, n, reps) {
  const { context, sequence } = await newSequence(threads, Math.max(256, n + 16), 512);
  let best = 0;
  let ids = [];
  for (let r = 0; r <= reps; r++) {
    await sequence.clearHistory();
    const got = [];
    let t0 = 0;
    for await (const tok of sequence.evaluate([bos], { temperature: 0 })) {
      if (got.length === 0) t0 = performance.now();
      got.push(tok);
      if (got.length >= n + 1) break;
    }
    const secs = (performance.now() - t0) / 1000;
    const rate = n / secs;
    if (r > 0 && rate > best) best = rate; // run 0 warms up
    ids = got;
  }
  await context.dispose();
  return { tokens_per_s: best, generated: n, first_ids: ids.slice(0, 8) };
}

async function prefillRate(threads, n, reps) {
  const { context, sequence } = await newSequence(threads, n + 64, n);
  const vocab = model.fileInsights?.vocabSize ?? 32000;
  const prompt = [bos];
  for (let i = 1; i < n; i++) prompt.push((i * 31 + 7) % vocab);
  let best = 0;
  for (let r = 0; r <= reps; r++) {
    await sequence.clearHistory();
    const t0 = performance.now();
    await sequence.evaluateWithoutGeneratingNewTokens(prompt);
    const secs = (performance.now() - t0) / 1000;
    const rate = n / secs;
    if (r > 0 && rate > best) best = rate;
  }
  await context.dispose();
  return { tokens_per_s: best, prompt_tokens: n };
}

async function greedy(threads, promptIds, n, top) {
  const { context, sequence } = await newSequence(threads, Math.max(256, promptIds.length + n + 16), 512);
  const ids = [];
  const tops = [];
  const gen = sequence.evaluateWithMetadata(promptIds, { probabilities: top > 0 }, { temperature: 0 });
  for await (const out of gen) {
    ids.push(out.token);
    if (top > 0) {
      const entries = [...out.probabilities.entries()].slice(0, top);
      tops.push(entries.map(([t, p]) => [t, Number(p.toFixed(6))]));
    }
    if (ids.length >= n) break;
  }
  await context.dispose();
  return { ids, top: top > 0 ? tops : undefined };
}

async function forced(threads, ids, from) {
  const { context, sequence } = await newSequence(threads, Math.max(256, ids.length + 16), 512);
  const input = ids.map((t, i) => (i >= from - 1 ? [t, { generateNext: { token: true, options: { temperature: 0 } } }] : t));
  const out = await sequence.controlledEvaluate(input);
  const predicted = [];
  let agree = 0;
  for (let i = from - 1; i < ids.length; i++) {
    const tok = out[i]?.next?.token;
    predicted.push(tok);
    if (i + 1 < ids.length && tok === ids[i + 1]) agree++;
  }
  await context.dispose();
  const steps = ids.length - from;
  return { predicted, agree, steps, agreement: steps > 0 ? agree / steps : 0 };
}

const info = {
  llama_cpp_release: llama.llamaCppRelease,
  gpu: llama.gpu,
  cpu_math_cores: llama.cpuMathCores,
  system_info: llama.systemInfo,
  model: args.model,
  model_size_bytes: model.size,
  backend: backendLines,
};

let result;
if (mode === "info") {
  result = info;
} else if (mode === "greedy") {
  const threads = Number(args.threads ?? 2);
  const r = await greedy(threads, intList(args["prompt-ids"], [bos]), Number(args.n ?? 32), Number(args.top ?? 0));
  result = { ...info, threads, ...r };
} else if (mode === "forced") {
  const threads = Number(args.threads ?? 2);
  const ids = intList(args.ids, []);
  const from = Number(args.from ?? 1);
  if (ids.length < 2 || from < 1 || from >= ids.length) throw new Error("forced needs --ids with at least 2 ids and 1 <= --from < their count");
  result = { ...info, threads, ...(await forced(threads, ids, from)) };
} else if (mode === "bench") {
  const threads = intList(args.threads, [1, 2]);
  const reps = Number(args.reps ?? 3);
  const decodeN = Number(args.decode ?? 128);
  const prefillN = Number(args.prefill ?? 512);
  const decode = {};
  const prefill = {};
  for (const t of threads) {
    decode[t] = await decodeRate(t, decodeN, reps);
    console.error(`decode threads=${t}: ${decode[t].tokens_per_s.toFixed(1)} tok/s`);
  }
  for (const t of intList(args["prefill-threads"], [Math.max(...threads)])) {
    prefill[t] = await prefillRate(t, prefillN, reps);
    console.error(`prefill${prefillN} threads=${t}: ${prefill[t].tokens_per_s.toFixed(1)} tok/s`);
  }
  result = { ...info, decode, prefill };
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
console.log(JSON.stringify(result, null, 2));
await model.dispose();
await llama.dispose();
