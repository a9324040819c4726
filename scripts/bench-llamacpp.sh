#!/bin/sh
# Compares stoke's FP8 CPU decode and prefill with llama.cpp's Q8_0 on the
# same synthetic model and machine.
#
#   scripts/bench-llamacpp.sh [OUT_DIR]
#
# 1. Installs node-llama-cpp (npm; prebuilt llama.cpp CPU binaries from
#    @node-llama-cpp/linux-x64) into a cache keyed by version,
#    ${XDG_CACHE_HOME:-$HOME/.cache}/stoke/node-llama-cpp-VERSION: "best"
#    is the package as shipped (ggml picks the best of its CPU backend
#    variants for this CPU), "avx2" a copy holding only the haswell
#    (AVX2+FMA+F16C) variant, so ggml has no other to pick.
# 2. Builds stoke, synthesises the 100m preset (seed 1) in F32 and FP8, and
#    exports the F32 one to GGUF Q8_0 (and F32) with
#    `stoke model export-gguf`.
# 3. Checks correctness: stoke's greedy ids for a short prompt on the F32
#    and FP8 checkpoints against llama.cpp's on the Q8_0 (and F32) GGUF,
#    free-running and teacher-forced (llama.cpp's greedy choice after each
#    position of stoke's F32 output); and, when ../shared/models/stories260K
#    (a trained model with golden ids) exists, llama.cpp's greedy output on
#    its GGUF against the golden ids.
# 4. Measures llama.cpp (both variants, each through the binding as shipped
#    and with a persistent threadpool, see below): decode tok/s generating
#    128 tokens greedily at 1 and 2 threads, prefill tok/s of a 512-token
#    prompt in one 512-token batch at 2 threads; CPU backend only.
# 5. Measures stoke with BenchmarkKernelSetsModel (FP8 decode at 1 and 2
#    threads, 512-token prefill at 2 threads) with STOKE_KERNELS=avx2 and
#    unset (the best set), one benchmark at a time.
# 6. Prints a table and writes everything under OUT_DIR (default
#    ${TMPDIR:-/tmp}/stoke-bench-llamacpp).
#
# Environment: NODE_LLAMA_CPP_VERSION (default 3.22.1), REPS (llama.cpp
# timed runs per figure after a warm-up, default 3), ROUNDS (how many times
# every measurement is repeated, llama.cpp and stoke alike, default 2; the
# table gives the best round and the range when they differ by over 5%), BENCHTIME (go test
# -benchtime, default 3x for prefill and 200x for decode: DECODE_BENCHTIME,
# PREFILL_BENCHTIME), SKIP_STOKE=1 (llama.cpp only), SKIP_LLAMACPP=1,
# QUIET_BUSY and QUIET_WAIT (see quiet below: each measurement waits for
# the machine to be idle, since on a 2-core machine any other process
# skews it).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/stoke/node-llama-cpp-$version
out=${1:-${TMPDIR:-/tmp}/stoke-bench-llamacpp}
reps=${REPS:-3}
rounds=${ROUNDS:-2}
decode_benchtime=${DECODE_BENCHTIME:-${BENCHTIME:-200x}}
prefill_benchtime=${PREFILL_BENCHTIME:-${BENCHTIME:-3x}}
mjs=$root/scripts/llamacpp-bench.mjs
mkdir -p "$out"
out=$(cd "$out" && pwd)

say() { echo "bench-llamacpp: $*" >&2; }
die() {
	say "$*"
	exit 1
}

command -v node >/dev/null 2>&1 || die "node is not installed (apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || die "npm is not installed (apt-get install npm)"
command -v go >/dev/null 2>&1 || die "go is not installed"

# busy prints the percentage of CPU time the whole machine spent busy over
# the next second.
busy() {
	a=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat)
	sleep 1
	b=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat)
	echo "$a $b" | awk '{bu=$3-$1; id=$4-$2; t=bu+id; if (t<=0) t=1; printf "%d\n", 100*bu/t}'
}

# quiet waits (up to QUIET_WAIT seconds, default 300) until the machine has
# been under QUIET_BUSY percent busy (default 10) for 3 seconds in a row,
# so that other work on a shared machine does not skew a measurement; it
# says so when it gives up, and logs the load to $out/load.log.
quiet() {
	waited=0
	calm=0
	while [ "$calm" -lt 3 ]; do
		b=$(busy)
		if [ "$b" -lt "${QUIET_BUSY:-10}" ]; then calm=$((calm + 1)); else calm=0; fi
		waited=$((waited + 1))
		if [ "$waited" -ge "${QUIET_WAIT:-300}" ]; then
			say "machine still busy ($b%) after ${waited}s; measuring $1 anyway"
			echo "$(date -u +%FT%TZ) $1: busy ${b}% (gave up waiting)" >>"$out/load.log"
			return 0
		fi
	done
	echo "$(date -u +%FT%TZ) $1: quiet after ${waited}s" >>"$out/load.log"
}

# json FILE EXPR prints the JavaScript expression EXPR of the JSON in FILE
# (bound to r).
json() {
	node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));const v=eval(process.argv[2]);console.log(typeof v==="object"?JSON.stringify(v):v)' "$1" "$2"
}

# --- 1. node-llama-cpp -----------------------------------------------------
bins() { echo "$1/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"; }
if [ ! -f "$(bins "$cache/best")/llama-addon.node" ]; then
	say "installing node-llama-cpp@$version into $cache/best"
	rm -rf "$cache/best" "$cache/avx2"
	mkdir -p "$cache/best"
	# --omit=optional skips the CUDA and Vulkan builds; --ignore-scripts
	# skips the postinstall step, which would try to download or build.
	(cd "$cache/best" && npm init -y >/dev/null &&
		npm install --no-audit --no-fund --omit=optional --ignore-scripts --save-exact \
			"node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >"$cache/npm-install.log" 2>&1) ||
		{
			cat "$cache/npm-install.log" >&2
			die "npm install node-llama-cpp@$version failed"
		}
fi
[ -f "$(bins "$cache/best")/libggml-cpu-haswell.so" ] || die "$(bins "$cache/best") has no libggml-cpu-haswell.so"
if [ ! -f "$(bins "$cache/avx2")/libggml-cpu-haswell.so" ]; then
	say "making the AVX2-only copy $cache/avx2"
	rm -rf "$cache/avx2"
	cp -a "$cache/best" "$cache/avx2"
	for f in "$(bins "$cache/avx2")"/libggml-cpu-*.so; do
		case $f in */libggml-cpu-haswell.so) ;; *) rm -f "$f" ;; esac
	done
fi
variants=$(cd "$(bins "$cache/best")" && ls libggml-cpu-*.so | sed 's/^libggml-cpu-//; s/\.so$//' | tr '\n' ' ')
say "ggml CPU variants shipped: $variants"

# nlc VARIANT ARGS... runs the binding script with one variant's tree,
# preloading $preload when it is set.
preload=
nlc() {
	v=$1
	shift
	env LD_PRELOAD="$preload" LLAMACPP_BINS="$(bins "$cache/$v")" \
		NODE_LLAMA_CPP_MODULE="$cache/$v/node_modules/node-llama-cpp/dist/index.js" node "$mjs" "$@"
}

# --- 2. models ---------------------------------------------------------------
say "building stoke"
(cd "$root" && go build -o "$out/stoke" ./cmd/stoke)
stoke=$out/stoke
models=$out/models
mkdir -p "$models"
[ -f "$models/100m-f32/config.json" ] || "$stoke" model synth --preset 100m --seed 1 --out "$models/100m-f32"
[ -f "$models/100m-fp8/config.json" ] || "$stoke" model synth --preset 100m --seed 1 --dtype fp8 --out "$models/100m-fp8"
"$stoke" model export-gguf "$models/100m-f32" "$models/100m-q8_0.gguf"
"$stoke" model export-gguf --type f32 "$models/100m-f32" "$models/100m-f32.gguf"

# --- 3. correctness ----------------------------------------------------------
if [ "${SKIP_LLAMACPP:-}" != 1 ]; then
	bos=$(json "$models/100m-f32/config.json" r.bos_token_id)
	prompt="$bos,400,1200,5000,77,9000,123"
	n=32
	"$stoke" generate --model "$models/100m-f32" --prompt-ids "$prompt" --max-tokens $n --ignore-eos --json >"$out/stoke-f32-greedy.json"
	"$stoke" generate --model "$models/100m-fp8" --prompt-ids "$prompt" --max-tokens $n --ignore-eos --json >"$out/stoke-fp8-greedy.json"
	nlc best greedy --model "$models/100m-q8_0.gguf" --prompt-ids "$prompt" --n $n >"$out/llamacpp-q8_0-greedy.json" 2>"$out/llamacpp-greedy.log"
	seq=$(json "$out/stoke-f32-greedy.json" '[...r.prompt_ids,...r.ids].join(",")')
	for g in q8_0 f32; do
		nlc best forced --model "$models/100m-$g.gguf" --ids "$seq" --from 7 >"$out/llamacpp-$g-forced.json" 2>>"$out/llamacpp-greedy.log"
	done
	if [ -d "$root/../shared/models/stories260K" ]; then
		s260=$root/../shared/models/stories260K
		"$stoke" model export-gguf "$s260" "$models/stories260K-q8_0.gguf"
		golden=$(json "$s260/golden.json" 'r.cases.find(c=>c.name==="bos").greedy_completion_ids.join(",")')
		nlc best greedy --model "$models/stories260K-q8_0.gguf" --prompt-ids 1 --n "$(echo "$golden" | tr ',' '\n' | wc -l)" \
			>"$out/llamacpp-stories260K-greedy.json" 2>>"$out/llamacpp-greedy.log"
		echo "$golden" >"$out/stories260K-golden.txt"
		# Control: the same export without the q/k RoPE permutation.
		"$stoke" model export-gguf --keep-hf-rope-layout "$s260" "$models/stories260K-q8_0-nopermute.gguf"
		nlc best greedy --model "$models/stories260K-q8_0-nopermute.gguf" --prompt-ids 1 --n "$(echo "$golden" | tr ',' '\n' | wc -l)" \
			>"$out/llamacpp-stories260K-nopermute-greedy.json" 2>>"$out/llamacpp-greedy.log"
	fi
	node - "$out" <<'EOF' | tee "$out/correctness.txt"
const fs = require("fs"), out = process.argv[2];
const rd = (f) => JSON.parse(fs.readFileSync(`${out}/${f}`, "utf8"));
const same = (a, b) => { let n = 0; for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] === b[i]) n++; return n; };
const prefix = (a, b) => { let i = 0; while (i < a.length && i < b.length && a[i] === b[i]) i++; return i; };
const f32 = rd("stoke-f32-greedy.json").ids, fp8 = rd("stoke-fp8-greedy.json").ids, q8 = rd("llamacpp-q8_0-greedy.json").ids;
console.log(`greedy ids, 32 tokens after a 7-token prompt (same position, common prefix):`);
console.log(`  stoke FP8        vs stoke F32: ${same(fp8, f32)}/32 same, prefix ${prefix(fp8, f32)}`);
console.log(`  llama.cpp Q8_0   vs stoke F32: ${same(q8, f32)}/32 same, prefix ${prefix(q8, f32)}`);
console.log(`  llama.cpp Q8_0   vs stoke FP8: ${same(q8, fp8)}/32 same, prefix ${prefix(q8, fp8)}`);
for (const g of ["q8_0", "f32"]) {
  const r = rd(`llamacpp-${g}-forced.json`);
  console.log(`  teacher-forced on stoke F32's ids, llama.cpp ${g.toUpperCase()} GGUF: ${r.agree}/${r.steps} next-token agreement`);
}
if (fs.existsSync(`${out}/stories260K-golden.txt`)) {
  const gold = fs.readFileSync(`${out}/stories260K-golden.txt`, "utf8").trim().split(",").map(Number);
  const got = rd("llamacpp-stories260K-greedy.json").ids;
  console.log(`  stories260K (trained) Q8_0 GGUF, greedy from BOS vs golden ids: ${same(got, gold)}/${gold.length} same, prefix ${prefix(got, gold)}`);
  const bad = rd("llamacpp-stories260K-nopermute-greedy.json").ids;
  console.log(`  control, the same without the q/k RoPE permutation:              ${same(bad, gold)}/${gold.length} same, prefix ${prefix(bad, gold)}`);
}
EOF
fi

# --- 4. llama.cpp speed ------------------------------------------------------
# Each variant runs twice: through the binding as shipped, which attaches
# no threadpool to its contexts, so ggml starts a disposable one (and its
# threads) for every graph, i.e. every decoded token; and with
# scripts/llamacpp-threadpool.c preloaded, which attaches a persistent
# threadpool as llama-cli and llama-bench do. The shim is built with cc
# against the llama.cpp sources node-llama-cpp ships (a git bundle); without
# cc or git those rows are skipped.
pool_so=
if [ "${SKIP_LLAMACPP:-}" != 1 ]; then
	bundle=$cache/best/node_modules/node-llama-cpp/llama/gitRelease.bundle
	if command -v cc >/dev/null 2>&1 && command -v git >/dev/null 2>&1 && [ -f "$bundle" ]; then
		if [ ! -f "$cache/llama.cpp-src/include/llama.h" ]; then
			rm -rf "$cache/llama.cpp-src"
			# Only the headers are needed.
			{ git clone -q --no-checkout "$bundle" "$cache/llama.cpp-src" &&
				git -C "$cache/llama.cpp-src" checkout -q HEAD -- include ggml/include; } 2>/dev/null ||
				say "cannot unpack the headers from $bundle"
		fi
		if [ -f "$cache/llama.cpp-src/include/llama.h" ] &&
			cc -O2 -shared -fPIC -I "$cache/llama.cpp-src/include" -I "$cache/llama.cpp-src/ggml/include" \
				-o "$out/llamacpp-threadpool.so" "$root/scripts/llamacpp-threadpool.c" -ldl -lpthread; then
			pool_so=$out/llamacpp-threadpool.so
		else
			say "cannot build the threadpool shim; measuring the binding as shipped only"
		fi
	else
		say "no cc, git or llama.cpp bundle; measuring the binding as shipped only"
	fi
	round=0
	while [ "$round" -lt "$rounds" ]; do
		round=$((round + 1))
		for v in avx2 best; do
			for mode in binding pool; do
				preload=
				if [ "$mode" = pool ]; then
					[ -n "$pool_so" ] || continue
					preload=$pool_so
				fi
				name=llamacpp-$v-$mode-$round
				quiet "$name"
				say "llama.cpp ($v variants, $mode threads, round $round): decode and prefill"
				nlc "$v" bench --model "$models/100m-q8_0.gguf" --threads 1,2 --decode 128 --prefill 512 --reps "$reps" \
					>"$out/$name.json" 2>"$out/$name.log" || {
					cat "$out/$name.log" >&2
					die "llama.cpp benchmark ($v, $mode) failed"
				}
				loaded=$(grep -o 'libggml-cpu-[a-z0-9_]*\.so' "$out/$name.log" | head -1)
				say "llama.cpp ($v, $mode) loaded $loaded"
				echo "$loaded" >"$out/llamacpp-$v.variant"
			done
		done
	done
	preload=
	grep -q haswell "$out/llamacpp-avx2.variant" || die "the avx2 run loaded $(cat "$out/llamacpp-avx2.variant"), not haswell"
fi

# --- 5. stoke speed ----------------------------------------------------------
if [ "${SKIP_STOKE:-}" != 1 ]; then
	: >"$out/stoke-bench.txt"
	for set in avx2 avx512; do
		if [ "$set" = avx2 ]; then kern=avx2; else kern=; fi
		for what in "decode:$decode_benchtime" "prefill512:$prefill_benchtime"; do
			kind=${what%%:*}
			bt=${what#*:}
			quiet "stoke $kind $set"
			say "stoke $kind on $set (-benchtime $bt)"
			(cd "$root" && STOKE_KERNELS=$kern go test -run '^$' -bench "KernelSetsModel/$kind/$set/100m/F8_E4M3/" \
				-benchtime "$bt" -count "$rounds" ./weightstore/synth/) | tee -a "$out/stoke-bench.txt" | grep '^Benchmark' >&2 || true
		done
	done
fi

# --- 6. table ----------------------------------------------------------------
node - "$out" <<'EOF' | tee "$out/table.md"
const fs = require("fs"), out = process.argv[2];
const ex = (f) => fs.existsSync(`${out}/${f}`);
const rd = (f) => JSON.parse(fs.readFileSync(`${out}/${f}`, "utf8"));
const rows = [];
// Each cell: the best of the rounds, with the range when they differ.
const cell = (xs) => {
  xs = xs.filter((x) => x !== undefined);
  if (xs.length === 0) return "—";
  const hi = Math.max(...xs), lo = Math.min(...xs);
  return xs.length > 1 && hi - lo > 0.05 * hi ? `${hi.toFixed(1)} (${lo.toFixed(1)}–${hi.toFixed(1)})` : hi.toFixed(1);
};
for (const v of ["avx2", "best"]) {
  for (const mode of ["binding", "pool"]) {
    const runs = fs.readdirSync(out).filter((f) => f.startsWith(`llamacpp-${v}-${mode}-`) && f.endsWith(".json")).map(rd);
    if (runs.length === 0) continue;
    const lib = fs.readFileSync(`${out}/llamacpp-${v}.variant`, "utf8").trim().replace(/^libggml-cpu-|\.so$/g, "");
    rows.push([`llama.cpp Q8_0, ggml ${lib} (${v === "avx2" ? "AVX2 only" : "best for this CPU"}), ${mode === "pool" ? "persistent threadpool" : "binding as shipped"}`,
      cell(runs.map((r) => r.decode[1]?.tokens_per_s)), cell(runs.map((r) => r.decode[2]?.tokens_per_s)), cell(runs.map((r) => r.prefill[2]?.tokens_per_s))]);
  }
}
if (ex("stoke-bench.txt")) {
  const lines = fs.readFileSync(`${out}/stoke-bench.txt`, "utf8").split("\n");
  const get = (re) => lines.filter((l) => re.test(l)).map((l) => { const m = l.match(/([\d.]+) tokens\/s/); return m ? Number(m[1]) : undefined; });
  for (const set of ["avx2", "avx512"]) {
    rows.push([`stoke FP8, ${set} kernels`,
      cell(get(new RegExp(`decode/${set}/100m/F8_E4M3/threads=1\\b`))), cell(get(new RegExp(`decode/${set}/100m/F8_E4M3/threads=2\\b`))),
      cell(get(new RegExp(`prefill512/${set}/100m/F8_E4M3/threads=2\\b`)))]);
  }
}
console.log("| 100m synthetic model | decode tok/s, 1 thread | decode tok/s, 2 threads | prefill tok/s, 512 tokens, 2 threads |");
console.log("|---|---|---|---|");
for (const r of rows) console.log(`| ${r.join(" | ")} |`);
EOF
say "results in $out"
