package checkpoint

// Validation helpers for a checkpoint that is not loaded: the watcher runs
// them on config.json, the safetensors headers and the tokenizer files
// before it records a revision as ready, reading no weights.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/stokehq/stoke/engine/model"
	"github.com/stokehq/stoke/engine/tokenizer"
	"github.com/stokehq/stoke/weightstore/safetensors"
)

// CheckShapes checks the tensors of the shards with these headers against
// those cfg implies (model.Config.TensorShapes, what the loader checks):
// the number of blocks present must be num_hidden_layers, and every tensor
// the config implies must be present with its shape (embedding [vocab,
// hidden], each block's norms and q/k/v/o/gate/up/down projections, the
// final norm and the output head unless tied). Other tensors (FP8 scales,
// rotary buffers) are not checked.
func CheckShapes(cfg *model.Config, headers ...*safetensors.Header) error {
	tensors := map[string]safetensors.TensorInfo{}
	layers := map[int]bool{}
	for _, h := range headers {
		if h == nil {
			continue
		}
		for _, t := range h.Tensors {
			tensors[t.Name] = t
			if rest, ok := strings.CutPrefix(t.Name, "model.layers."); ok {
				if n, _, ok := strings.Cut(rest, "."); ok {
					if i, err := strconv.Atoi(n); err == nil && i >= 0 {
						layers[i] = true
					}
				}
			}
		}
	}
	// Counted first: a config claiming a million layers must not make a
	// list of nine million expected tensors.
	if len(layers) != cfg.NumLayers {
		return fmt.Errorf("config.json says num_hidden_layers %d but the safetensors files hold %d layers", cfg.NumLayers, len(layers))
	}
	for _, ns := range cfg.TensorShapes() {
		t, ok := tensors[ns.Name]
		if !ok {
			return fmt.Errorf("tensor %s, which config.json implies, is missing from the safetensors files", ns.Name)
		}
		if !slices.Equal(t.Shape, ns.Shape) {
			return fmt.Errorf("tensor %s has shape %v, config.json implies %v (hidden_size %d, intermediate_size %d, vocab_size %d, %d heads of %d, %d kv heads)",
				ns.Name, t.Shape, ns.Shape, cfg.HiddenSize, cfg.IntermediateSize, cfg.VocabSize, cfg.NumHeads, cfg.HeadDim, cfg.NumKVHeads)
		}
	}
	return nil
}

// ChatTemplateFile is the chat template file the tokenizer reads when
// tokenizer_config.json has none.
const ChatTemplateFile = tokenizer.ChatTemplateFile

// CheckTokenizer builds the tokenizer from a checkpoint's tokenizer files
// (tokenizer.json and, when present, tokenizer_config.json and
// chat_template.jinja, by name) with the engine's loader, and checks it
// against cfg: every token id (vocabulary, added tokens, BOS and EOS) lies
// within vocab_size; a chat template present must compile (the loader
// refuses one that does not). Without
// tokenizer.json there is nothing to check.
func CheckTokenizer(cfg *model.Config, files map[string][]byte) error {
	if _, ok := files[TokenizerFile]; !ok {
		return nil
	}
	tok, err := tokenizer.FromFiles(files)
	if err != nil {
		return err
	}
	if n := tok.VocabSize(); n > cfg.VocabSize {
		return fmt.Errorf("%s has token id %d (%q), outside config.json's vocab_size %d", TokenizerFile, n-1, tok.Token(int32(n-1)), cfg.VocabSize)
	}
	if id, ok := tok.BOS(); ok && int(id) >= cfg.VocabSize {
		return fmt.Errorf("the tokenizer's BOS token id %d is outside config.json's vocab_size %d", id, cfg.VocabSize)
	}
	for _, id := range tok.EOS() {
		if int(id) >= cfg.VocabSize {
			return fmt.Errorf("the tokenizer's EOS token id %d is outside config.json's vocab_size %d", id, cfg.VocabSize)
		}
	}
	return nil
}
