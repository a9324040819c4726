package server

import (
	"context"
	"strings"
	"testing"

	"github.com/stokehq/stoke/engine/engineapi"
	"github.com/stokehq/stoke/engine/sched"
)

func TestSimLoader(t *testing.T) {
	o := EngineOptions{Sched: sched.Config{MaxNumBatchedTokens: 512, MaxNumSeqs: 1000, MaxModelLen: 4096}, PrefixCaching: true}
	l, err := SimLoader(o, "")(context.Background(), engineapi.LoadRequest{Path: "llama-3.1-8b-fp8-h100"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != "nvidia/Llama-3.1-8B-Instruct-FP8" || l.MaxModelLen != 4096 || l.Tokenizer == nil {
		t.Fatalf("loaded %q with context %d", l.Name, l.MaxModelLen)
	}
	e, err := l.Start(nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := e.Stats(); s.KVBlocks == 0 {
		t.Fatal("sim engine has no KV blocks")
	}
	o.ServedName = "sim-8b"
	if l, err = SimLoader(o, "")(context.Background(), engineapi.LoadRequest{Path: "llama-3.1-8b-fp8-h100"}, nil); err != nil || l.Name != "sim-8b" {
		t.Fatalf("served name: %v %v", l, err)
	}
	if _, err := SimLoader(o, "")(context.Background(), engineapi.LoadRequest{Path: "no-such-profile"}, nil); err == nil || !strings.Contains(err.Error(), "no-such-profile") {
		t.Fatalf("unknown profile: %v", err)
	}
}

func TestSchedFor(t *testing.T) {
	for _, tc := range []struct{ flag, model, want int }{{0, 512, 512}, {100, 512, 100}, {4096, 512, 512}} {
		o := EngineOptions{Sched: sched.Config{MaxModelLen: tc.flag}}
		if got := o.SchedFor(tc.model).MaxModelLen; got != tc.want {
			t.Errorf("flag %d, model %d: %d, want %d", tc.flag, tc.model, got, tc.want)
		}
	}
}

func TestSimLoaderServesBucketModels(t *testing.T) {
	l, err := SimLoader(EngineOptions{}, "llama-3.1-8b-fp8-h100")(context.Background(), engineapi.LoadRequest{Source: "s3://models", Model: "chat"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != "chat" {
		t.Fatalf("served as %q, want the model's name", l.Name)
	}
	if _, err := SimLoader(EngineOptions{}, "")(context.Background(), engineapi.LoadRequest{Source: "s3://models", Model: "chat"}, nil); err == nil {
		t.Fatal("a sim loader without a default profile loaded a bucket model")
	}
}
