// Package bench measures the platform from the outside: the cold-start
// bench drives a deployment into each tier through the admin API and times
// one request's first token, with where that time went.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/stokehq/stoke/internal/tier"
)

// ColdStartOptions say what to measure.
type ColdStartOptions struct {
	// URL is stoke serve's base URL; Model the deployment.
	URL, Model string
	// Tiers to measure, in order (t1…t4).
	Tiers []tier.Tier
	// Runs per tier.
	Runs int
	// Client makes the requests (default: one without a timeout).
	Client *http.Client
}

// ColdStartBreakdown is where a cold request's time went, in seconds.
type ColdStartBreakdown struct {
	// Wait is the request's time before its replica's acquisition and
	// after it not accounted for below (scaler reaction, buffering).
	Wait float64 `json:"wait_seconds"`
	// Start is starting a runtime (t4).
	Start float64 `json:"start_seconds"`
	// Fetch is streaming the weights.
	Fetch float64 `json:"fetch_seconds"`
	// Load is building the model and waking or warming the replica.
	Load float64 `json:"load_seconds"`
	// FirstToken is a warm request's time to first token on that replica.
	FirstToken float64 `json:"first_token_seconds"`
}

// TierResult is one measured cold request.
type TierResult struct {
	Tier tier.Tier `json:"tier"`
	// Served is the tier the platform reports for the acquisition.
	Served    tier.Tier          `json:"served_tier"`
	TTFT      float64            `json:"ttft_seconds"`
	Breakdown ColdStartBreakdown `json:"breakdown"`
}

// ColdStartReport is what `stoke bench cold-start --json` prints.
type ColdStartReport struct {
	Tiers []TierResult `json:"tiers"`
}

// ColdStart measures every tier Runs times.
func ColdStart(ctx context.Context, o ColdStartOptions) (ColdStartReport, error) {
	if o.Client == nil {
		o.Client = &http.Client{}
	}
	if o.Runs < 1 {
		o.Runs = 1
	}
	var rep ColdStartReport
	for _, t := range o.Tiers {
		for range o.Runs {
			r, err := coldRequest(ctx, o, t)
			if err != nil {
				return rep, fmt.Errorf("tier %s: %w", t, err)
			}
			rep.Tiers = append(rep.Tiers, r)
		}
	}
	return rep, nil
}

func coldRequest(ctx context.Context, o ColdStartOptions, t tier.Tier) (TierResult, error) {
	if err := o.call(ctx, http.MethodPost, "/admin/deployments/"+o.Model+"/prepare", fmt.Sprintf(`{"tier":%q}`, t), nil); err != nil {
		return TierResult{}, fmt.Errorf("prepare: %w", err)
	}
	ttft, replica, err := o.firstToken(ctx)
	if err != nil {
		return TierResult{}, err
	}
	// The acquisition's JSON, as GET /admin/deployments/NAME/acquisition
	// writes it: the bench reads the wire format, not the runtime's types.
	var acq struct {
		Tier      tier.Tier `json:"tier"`
		Breakdown struct {
			Start  float64 `json:"start_seconds"`
			Fetch  float64 `json:"fetch_seconds"`
			Load   float64 `json:"load_seconds"`
			Wake   float64 `json:"wake_seconds"`
			Warmup float64 `json:"warmup_seconds"`
		} `json:"breakdown"`
	}
	if err := o.call(ctx, http.MethodGet, "/admin/deployments/"+o.Model+"/acquisition?runtime="+replica, "", &acq); err != nil {
		return TierResult{}, fmt.Errorf("read the acquisition: %w", err)
	}
	warm, _, err := o.firstToken(ctx)
	if err != nil {
		return TierResult{}, err
	}
	bd := acq.Breakdown
	b := ColdStartBreakdown{Start: bd.Start, Fetch: bd.Fetch, Load: bd.Load + bd.Wake + bd.Warmup, FirstToken: warm.Seconds()}
	b.Wait = max(0, ttft.Seconds()-b.Start-b.Fetch-b.Load-b.FirstToken)
	return TierResult{Tier: t, Served: acq.Tier, TTFT: ttft.Seconds(), Breakdown: b}, nil
}

// firstToken streams a one-token completion, times its first event and
// returns the runtime that served it.
func (o ColdStartOptions) firstToken(ctx context.Context) (time.Duration, string, error) {
	body := fmt.Sprintf(`{"model":%q,"prompt":"Once upon a time","max_tokens":1,"stream":true}`, o.Model)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := o.Client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, "", fmt.Errorf("completion: %d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	sc := bufio.NewScanner(resp.Body)
	var first time.Duration
	for sc.Scan() {
		if first == 0 && strings.HasPrefix(sc.Text(), "data: ") {
			first = time.Since(start)
		}
	}
	if first == 0 {
		return 0, "", fmt.Errorf("completion: no event streamed")
	}
	return first, resp.Header.Get("X-Stoke-Replica"), sc.Err()
}

func (o ColdStartOptions) call(ctx context.Context, method, path, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, o.URL+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// WriteTable prints the report as a table.
func (r ColdStartReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%-5s %-7s %9s %9s %9s %9s %9s %12s\n", "tier", "served", "ttft_s", "wait_s", "start_s", "fetch_s", "load_s", "first_tok_s")
	for _, t := range r.Tiers {
		b := t.Breakdown
		fmt.Fprintf(w, "%-5s %-7s %9.3f %9.3f %9.3f %9.3f %9.3f %12.3f\n", t.Tier, t.Served, t.TTFT, b.Wait, b.Start, b.Fetch, b.Load, b.FirstToken)
	}
}
