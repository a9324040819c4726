package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/stokehq/stoke/engine/generate"
	"github.com/stokehq/stoke/engine/sample"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/weightstore/checkpoint"
)

type generateFlags struct {
	model, prompt, promptIDs string
	kernels                  string
	maxTokens, topK, threads int
	temperature, topP        float64
	seed                     uint64
	ignoreEOS, json          bool
}

func newGenerateCmd() *cobra.Command {
	var f generateFlags
	cmd := &cobra.Command{
		Use:   "generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)",
		Short: "Generate a completion on the CPU engine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runGenerate(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.model, "model", "", "checkpoint directory")
	fl.StringVar(&f.prompt, "prompt", "", "prompt text (needs tokenizer.json)")
	fl.StringVar(&f.promptIDs, "prompt-ids", "", "prompt as comma-separated token ids")
	fl.IntVar(&f.maxTokens, "max-tokens", 64, "tokens to generate at most")
	fl.Float64Var(&f.temperature, "temperature", 0, "sampling temperature (0 = greedy)")
	fl.Float64Var(&f.topP, "top-p", 1, "nucleus sampling mass")
	fl.IntVar(&f.topK, "top-k", 0, "sample among the K most likely tokens (0 = all)")
	fl.Uint64Var(&f.seed, "seed", 0, "sampling seed")
	fl.BoolVar(&f.ignoreEOS, "ignore-eos", false, "keep generating past end-of-sequence tokens")
	fl.BoolVar(&f.json, "json", false, "print one JSON object instead of streaming text")
	fl.IntVar(&f.threads, "threads", 0, "compute threads (0 = all cores)")
	addKernelsFlag(fl, &f.kernels)
	cmd.MarkFlagRequired("model")
	return cmd
}

// generateOutput is what --json prints.
type generateOutput struct {
	PromptIDs       []int32 `json:"prompt_ids"`
	IDs             []int32 `json:"ids"`
	Text            string  `json:"text"`
	TokensPerSecond float64 `json:"tokens_per_second"`
	// Kernels is the kernel set that computed the output.
	Kernels string `json:"kernels"`
}

func runGenerate(cmd *cobra.Command, f generateFlags) error {
	if (f.prompt == "") == (f.promptIDs == "") {
		return errors.New("give exactly one of --prompt and --prompt-ids")
	}
	ks, err := selectKernels(f.kernels)
	if err != nil {
		return err
	}
	tok, err := tokenizer.Load(f.model)
	if err != nil && !errors.Is(err, tokenizer.ErrNoTokenizer) {
		return err
	}
	var prompt []int32
	if f.promptIDs != "" {
		if prompt, err = parseIDs(f.promptIDs); err != nil {
			return fmt.Errorf("--prompt-ids: %w", err)
		}
	} else {
		if tok == nil {
			return fmt.Errorf("%s has no tokenizer.json: pass the prompt with --prompt-ids", f.model)
		}
		prompt = tok.Encode(f.prompt, true)
	}

	pool := ks.NewPool(f.threads)
	defer pool.Close()
	m, ckpt, err := checkpoint.LoadModel(f.model, pool)
	if err != nil {
		return err
	}
	defer ckpt.Close()
	cfg := m.Config()
	for _, id := range prompt {
		if id < 0 || int(id) >= cfg.VocabSize {
			return fmt.Errorf("--prompt-ids: token %d is outside the vocabulary (%d)", id, cfg.VocabSize)
		}
	}
	opts := generate.Options{
		MaxTokens: f.maxTokens,
		Sampling:  sample.Params{Temperature: f.temperature, TopK: f.topK, TopP: f.topP, Seed: f.seed, Logprobs: -1},
		IgnoreEOS: f.ignoreEOS,
	}
	for _, id := range cfg.EOSTokenID {
		opts.StopIDs = append(opts.StopIDs, int32(id))
	}
	if tok != nil {
		opts.StopIDs = append(opts.StopIDs, tok.EOS()...)
	}

	var stream *tokenizer.StreamDecoder
	onToken := func(int32) {}
	if !f.json && tok != nil {
		stream = tok.NewStreamDecoder(true)
		onToken = func(id int32) { fmt.Fprint(cmd.OutOrStdout(), stream.Add(id)) }
	}
	res, err := generate.Run(cmd.Context(), m, prompt, opts, onToken)
	if err != nil {
		return err
	}
	out := generateOutput{PromptIDs: prompt, IDs: res.IDs, TokensPerSecond: res.DecodeTokensPerSecond(), Kernels: ks.Name()}
	if tok != nil {
		out.Text = tok.Decode(res.IDs, true)
	}
	if f.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		return enc.Encode(out)
	}
	if stream != nil {
		fmt.Fprintln(cmd.OutOrStdout(), stream.Flush())
	} else {
		fmt.Fprintln(cmd.OutOrStdout(), formatIDs(res.IDs))
	}
	slog.Info("generated", "prompt_tokens", len(prompt), "tokens", len(res.IDs), "finish", res.FinishReason,
		"prefill", res.PrefillTime.Round(1e5), "decode_tokens_per_second", fmt.Sprintf("%.1f", out.TokensPerSecond),
		"kernels", ks.Name(), "max_rss_mib", maxRSSMiB())
	return nil
}

func parseIDs(s string) ([]int32, error) {
	var ids []int32
	for _, part := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(part), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a token id", part)
		}
		ids = append(ids, int32(v))
	}
	return ids, nil
}

func formatIDs(ids []int32) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.Itoa(int(id))
	}
	return strings.Join(parts, ",")
}

// maxRSSMiB is the process's peak resident memory, mapped weights included.
func maxRSSMiB() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Maxrss >> 10
}
