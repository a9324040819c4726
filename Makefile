# stoke — build, run and test. Every target works on a fresh machine with Go
# and the module proxy; nothing else needs installing by hand.
GO      ?= go
BIN     := bin/stoke
DATA    := .stoke
DEMO    := $(DATA)/models/demo

.PHONY: build run deps test bench lint fuzz clean

build:
	$(GO) build -o $(BIN) ./cmd/stoke

# `make run` starts the platform on its embedded defaults: state, runtimes
# and the default bucket under ./.stoke, the API on 127.0.0.1:8080. On the
# first run it pushes a small synthetic model into the bucket as "demo".
BUCKET  := $(DATA)/bucket
run: build
	@test -f $(DEMO)/config.json || $(BIN) model synth --preset small --out $(DEMO) --seed 1
	@mkdir -p $(BUCKET)
	@test -f $(BUCKET)/demo/manifest.json || $(BIN) push $(DEMO) file://$(CURDIR)/$(BUCKET)/demo
	@echo 'stoke: try  curl -s localhost:8080/v1/chat/completions -d '"'"'{"model":"demo","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":32}'"'"
	$(BIN) serve --data $(DATA)

# Test dependencies: the MinIO server the weight-store tests run against
# (built once with `go install`, a few minutes the first time), AWS's EC2
# instance metadata mock for the spot interruption tests (`go install` too,
# seconds), Debian's containerd and runc for the node-cache tests (each
# test starts its own private containerd), Debian's prometheus and
# promtool for the monitoring rules and dashboard test (a private server),
# the Kubernetes control plane and kubelet built from the module proxy
# (12-16 minutes the first time) with Debian's etcd, CNI plugins,
# PostgreSQL and Redis for the cluster and several-gateway tests, and the
# helm CLI for the chart's tests, and Debian's CUDA 11.8 headers and
# libraries with ptxas (non-free; about 1.6 GB the first time), with which
# the CUDA code (-tags cuda) builds and its PTX assembles without a GPU.
deps:
	@GO=$(GO) sh ./scripts/install-minio.sh
	@GO=$(GO) sh ./scripts/install-ec2-metadata-mock.sh
	@sh ./scripts/install-containerd.sh
	@sh ./scripts/install-prometheus.sh
	@GO=$(GO) sh ./scripts/install-kubernetes.sh
	@GO=$(GO) sh ./scripts/install-helm.sh
	@sh ./scripts/install-cuda-headers.sh --with-ptxas

# Every package runs twice (with a 30-minute timeout: ./cmd/stoke's
# end-to-end tests build stoke and its images, which takes longer than go
# test's default 10 minutes on a cold 2-core machine): once as it is, once under the race detector
# with -short (which leaves out the slowest end-to-end cases), ./cmd
# included: the `stoke serve` and engine processes its tests start are the
# race-built test binary, and a race one of them reports fails the test
# that started it; then the
# engine's tests run again on emulated CPUs (an AVX2-only AMD EPYC 7001,
# and a baseline x86-64 without AVX), so a test cannot pass on this CPU
# and fail on another; last, the CUDA code is vetted and its test binaries
# built and linked (-tags cuda, and cuda,nocublas), which skip their GPU
# tests on a machine without one (scripts/gpu-check.sh runs them on one).
test: deps lint
	$(GO) test -count=1 -timeout 30m ./...
	$(GO) test -count=1 -timeout 30m -race -short ./...
	@GO=$(GO) sh ./scripts/test-cpus.sh
	@GO=$(GO) sh ./scripts/test-cuda-build.sh

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3x ./engine/... ./weightstore/...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet ./...

# Coverage-guided fuzzing of the safetensors header parser, the OpenAI
# request decoding and the deployment spec, each for FUZZTIME (go test
# -fuzz takes one target at a time); their seeds also run in `make test`.
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseHeader$$' -fuzztime $(FUZZTIME) ./weightstore/safetensors/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZTIME) ./internal/openai/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/config/

clean:
	rm -rf bin
