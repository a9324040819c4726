package engineapi

import "strings"

// AdapterSeparator joins a base model's served name and an adapter's name
// in the model field of a request: "BASE:ADAPTER".
const AdapterSeparator = ":"

// AdapterModel is the model name under which an adapter of base is served.
func AdapterModel(base, adapter string) string { return base + AdapterSeparator + adapter }

// SplitAdapterModel splits "BASE:ADAPTER" into its parts; ok is false for
// a name without an adapter.
func SplitAdapterModel(name string) (base, adapter string, ok bool) {
	i := strings.LastIndex(name, AdapterSeparator)
	if i <= 0 || i == len(name)-1 {
		return name, "", false
	}
	return name[:i], name[i+1:], true
}

// LoadAdapterRequest is the body of POST /admin/adapters and of vLLM's
// POST /v1/load_lora_adapter: it makes a LoRA adapter of the loaded base
// model servable under Name.
type LoadAdapterRequest struct {
	// Name is the adapter's name: requests name it as "BASE:NAME" or NAME.
	Name string `json:"lora_name"`
	// Path is the adapter's PEFT directory (adapter_config.json and
	// adapter_model.safetensors): a directory on this node, or a bucket
	// prefix (s3://bucket/base/adapters/NAME or file:///dir/...).
	Path string `json:"lora_path"`
	// Revision pins the revision digest of a bucket adapter; "" takes the
	// current one.
	Revision string `json:"revision,omitempty"`
}

// UnloadAdapterRequest is the body of vLLM's POST /v1/unload_lora_adapter
// (DELETE /admin/adapters/NAME needs none).
type UnloadAdapterRequest struct {
	Name string `json:"lora_name"`
}

// AdapterInfo describes one adapter an engine knows.
type AdapterInfo struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Revision string `json:"revision,omitempty"`
	Rank     int    `json:"rank"`
	// Loaded is true while the adapter's weights hold a slot.
	Loaded bool `json:"loaded"`
	// Running counts the requests using it now.
	Running int `json:"running"`
	// Waiting counts the requests for it that wait for a slot (or for
	// the scheduler).
	Waiting int `json:"waiting"`
}

// AdaptersInfo is the GET /admin/adapters body.
type AdaptersInfo struct {
	// Slots is how many adapters can be in one batch (--max-loras); 0
	// when LoRA is off.
	Slots    int           `json:"slots"`
	MaxRank  int           `json:"max_rank"`
	Adapters []AdapterInfo `json:"adapters"`
}
