package activator

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/stokehq/stoke/internal/config"
)

// provider is an external OpenAI-compatible API a route falls back to:
// requests go to its base URL under its model name with its key, through
// a circuit breaker of its own (failures before the first byte open it).
type provider struct {
	name    string
	model   string
	rp      httputil.ReverseProxy
	breaker *replicaBreaker
}

// newProvider makes a provider from its config, reading its key from the
// environment or its file now (the key is kept in memory only).
func newProvider(p config.Provider, breaker BreakerOptions) (*provider, error) {
	base, err := url.Parse(strings.TrimSuffix(p.BaseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("provider %s: base_url: %w", p.Name, err)
	}
	var key string
	switch {
	case p.APIKeyEnv != "":
		if key = os.Getenv(p.APIKeyEnv); key == "" {
			return nil, fmt.Errorf("provider %s: $%s is empty", p.Name, p.APIKeyEnv)
		}
	case p.APIKeyFile != "":
		b, err := os.ReadFile(p.APIKeyFile)
		if err != nil {
			return nil, fmt.Errorf("provider %s: read its key: %w", p.Name, err)
		}
		key = strings.TrimSpace(string(b))
	}
	timeout := time.Duration(p.Timeout)
	if timeout == 0 {
		timeout = time.Duration(config.DefaultProviderTimeout)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = timeout
	tr.DisableCompression = true
	pr := &provider{name: p.Name, model: p.Model, breaker: newReplicaBreaker("provider:"+p.Name, breaker.withDefaults(), func() {})}
	pr.rp = httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			if a, ok := r.In.Context().Value(attemptKey{}).(*attempt); ok {
				a.rewritten = true
			}
			// /v1/chat/completions → BASE/chat/completions (BASE ends in /v1).
			r.Out.URL.Scheme, r.Out.URL.Host = base.Scheme, base.Host
			r.Out.URL.Path = base.Path + strings.TrimPrefix(r.In.URL.Path, "/v1")
			r.Out.URL.RawPath = ""
			r.Out.Host = ""
			r.Out.Header.Del("Authorization") // the client's key is stoke's, never the provider's
			for h := range r.Out.Header {
				if strings.HasPrefix(strings.ToLower(h), "x-stoke-") {
					r.Out.Header.Del(h)
				}
			}
			if key != "" {
				r.Out.Header.Set("Authorization", "Bearer "+key)
			}
		},
		Transport:      tr,
		ModifyResponse: modifyResponse,
		ErrorHandler:   proxyError,
		BufferPool:     copyBuffers,
	}
	return pr, nil
}
