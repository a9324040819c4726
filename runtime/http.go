package runtime

import (
	"encoding/json"
	"net/http"
)

// RuntimesHandler serves GET /admin/runtimes: every runtime of the node
// as a JSON list, {"object":"list","data":[Info…]}. The api room mounts it.
func (m *Manager) RuntimesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, `{"error":{"message":"use GET","type":"invalid_request_error","param":null,"code":null}}`, http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(struct {
			Object string `json:"object"`
			Data   []Info `json:"data"`
		}{"list", m.Runtimes()})
	})
}
