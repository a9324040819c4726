package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// The monitoring files in deploy/'s Helm chart, from this package's
// directory.
const (
	rulesFile     = "../../deploy/helm/stoke/files/prometheus/stoke-rules.yaml"
	rulesTestFile = "../../deploy/helm/stoke/files/prometheus/stoke-rules.test.yaml"
	dashboardFile = "../../deploy/helm/stoke/files/grafana/stoke-dashboard.json"
)

// monitoringTools returns the paths of promtool and prometheus, skipping
// the test without them (failing it with STOKE_REQUIRE_PROMETHEUS=1).
func monitoringTools(t *testing.T) (promtool, prometheus string) {
	t.Helper()
	var missing []string
	paths := map[string]string{}
	for _, name := range []string{"promtool", "prometheus"} {
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name)
		}
		paths[name] = p
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("%s not on PATH; `make deps` installs Debian's prometheus package (scripts/install-prometheus.sh)", strings.Join(missing, " and "))
		if os.Getenv("STOKE_REQUIRE_PROMETHEUS") == "1" {
			t.Fatal(msg + " (STOKE_REQUIRE_PROMETHEUS=1)")
		}
		t.Skip(msg)
	}
	return paths["promtool"], paths["prometheus"]
}

// ruleFile is what the test reads of a Prometheus rules file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// dashPanel is what the test reads of a Grafana panel (a row holds its
// collapsed panels).
type dashPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

type dashboard struct {
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []dashPanel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// promExpr is one expression to evaluate, and where it came from.
type promExpr struct{ what, expr string }

// dashboardVars maps the dashboard's template and Grafana's built-in
// variables to what the test queries with.
var dashboardVars = map[string]string{"model": ".*", "tenant": ".*", "__rate_interval": "1m", "__interval": "1m", "__range": "5m"}

var dashboardVarRE = regexp.MustCompile(`\$\{?(\w+)\}?`)

// dashboardExprs reads the dashboard's targets and label_values variables
// (as the metric and label they ask for), failing on a variable the test
// does not know or a panel without a target.
func dashboardExprs(t *testing.T) (exprs []promExpr, labelVars [][2]string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("%s: schemaVersion %d, want 36 or later", dashboardFile, d.SchemaVersion)
	}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no target", p.Title)
			}
			for _, tg := range p.Targets {
				expr := dashboardVarRE.ReplaceAllStringFunc(tg.Expr, func(v string) string {
					name := dashboardVarRE.FindStringSubmatch(v)[1]
					if s, ok := dashboardVars[name]; ok {
						return s
					}
					t.Errorf("panel %q target %s: unknown variable %s", p.Title, tg.RefID, v)
					return v
				})
				exprs = append(exprs, promExpr{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), expr})
			}
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(METRIC, LABEL)", v.Name, q)
			continue
		}
		labelVars = append(labelVars, [2]string{m[1], m[2]})
	}
	for _, name := range []string{"datasource", "model", "tenant"} {
		if !vars[name] {
			t.Errorf("the dashboard has no %s variable", name)
		}
	}
	return exprs, labelVars
}

// startPrometheus runs a private Prometheus scraping target every second
// with rules loaded, and returns its base URL once it is ready.
func startPrometheus(t *testing.T, bin, target, rules string) string {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(rules)
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: stoke
    static_configs:
      - targets: [%q]
`, abs, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file", cfgPath, "--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", addr)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logFile.Close()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("prometheus's log:\n%s", b)
		}
	})
	base := "http://" + addr
	waitUntil(t, "prometheus is ready", 30*time.Second, func() bool {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus exited:\n%s", b)
		default:
		}
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return base
}

// promResult is an answer of Prometheus's HTTP API.
type promResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

// promQuery evaluates expr now and returns its samples (how many, how
// many of them NaN), or the error Prometheus gave.
func promQuery(base, expr string) (samples, nans int, err error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var r promResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, 0, err
	}
	if r.Status != "success" {
		return 0, 0, fmt.Errorf("%s", r.Error)
	}
	if r.Data.ResultType != "vector" {
		return 0, 0, fmt.Errorf("result type %s, want a vector", r.Data.ResultType)
	}
	for _, s := range r.Data.Result {
		if v, _ := s.Value[1].(string); v == "NaN" {
			nans++
		}
	}
	return len(r.Data.Result), nans, nil
}

// promRules is what the test reads of /api/v1/rules.
type promRules struct {
	Status string `json:"status"`
	Data   struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"data"`
}

// answerCounts counts answers by status (or transport error).
type answerCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (a *answerCounts) add(what string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == nil {
		a.n = map[string]int{}
	}
	a.n[what]++
}

func (a *answerCounts) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := make([]string, 0, len(a.n))
	for k := range a.n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = fmt.Sprintf("%s: %d", k, a.n[k])
	}
	return strings.Join(keys, ", ")
}

// monitoringLoad sends completions with key to base until stop is closed:
// plain and streamed, to chat and small, and now and then one for a model
// that does not exist (a 404) and one for the route far (a fallback). It
// counts the answers by status.
func monitoringLoad(base, key string, stop <-chan struct{}, codes *answerCounts) *sync.WaitGroup {
	client := &http.Client{Timeout: time.Minute}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				model := []string{"chat", "small"}[(w+i)%2]
				switch {
				case i%10 == 3 && w == 0:
					model = "no-such-model"
				case i%10 == 7 && w == 1:
					model = "far"
				}
				body := fmt.Sprintf(`{"model":%q,"prompt":"worker %d request %d","max_tokens":8}`, model, w, i)
				if i%2 == 1 {
					body = fmt.Sprintf(`{"model":%q,"prompt":"worker %d request %d","max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`, model, w, i)
				}
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := client.Do(req)
				if err != nil {
					codes.add("transport error")
					time.Sleep(100 * time.Millisecond)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes.add(fmt.Sprintf("%d %s", resp.StatusCode, model))
			}
		}()
	}
	return &wg
}

// TestMonitoring checks deploy/'s Prometheus rules and Grafana dashboard:
// promtool accepts the rules and their unit tests pass; then, with stoke
// serve running two sim deployments (and a third with no room, reached
// through a route's fallback) under load from a tenant's key, scraped by a
// private Prometheus that evaluates the rules, every recording rule's
// expression, every dashboard target and every dashboard variable returns
// samples, every alert's expression evaluates, and every rule group is
// healthy.
func TestMonitoring(t *testing.T) {
	if testing.Short() {
		t.Skip("starts serve, two sim engines and a Prometheus")
	}
	promtool, prometheus := monitoringTools(t)
	started := time.Now()

	out, err := exec.Command(promtool, "check", "rules", rulesFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", rulesFile, err, out)
	}
	t.Logf("promtool check rules: %s", strings.TrimSpace(string(out)))
	if out, err := exec.Command(promtool, "test", "rules", rulesTestFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", rulesTestFile, err, out)
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	var records, alerts []promExpr
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records = append(records, promExpr{"recording rule " + r.Record, r.Expr})
			} else {
				alerts = append(alerts, promExpr{"alert " + r.Alert, r.Expr})
			}
		}
	}
	panels, labelVars := dashboardExprs(t)
	if t.Failed() {
		t.FailNow()
	}

	// serve: chat and small take both slots, so cold never gets one and
	// the route far falls back from it to small.
	bucketDir := t.TempDir()
	priced := "replicas:\n  min: 1\n  max: 1\ncost:\n  replica_hourly_usd: 3.6\nprice:\n  input_per_1m: 1\n  output_per_1m: 2\n"
	pushTo(t, bucketDir, "chat", priced)
	pushTo(t, bucketDir, "small", priced)
	pushTo(t, bucketDir, "cold", "replicas:\n  min: 0\n  max: 1\n")
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	os.WriteFile(routes, []byte("routes:\n  - name: far\n    split: [{to: cold, weight: 1}]\n    fallbacks: [small]\n    fallback_after: 300ms\n"), 0o644)
	const adminKey = "sk-admin-monitoring-test-0123456789"
	keyFile := filepath.Join(t.TempDir(), "admin.key")
	os.WriteFile(keyFile, []byte(adminKey+"\n"), 0o600)
	data := t.TempDir()
	killEnginesAtEnd(t, data)
	addr := freeAddr(t)
	s := launchServe(t, nil, addr, "--data", data, "--bucket", "file://"+bucketDir, "--watch-interval", "100ms", "--warm", "0",
		"--slots", "2", "--sim-profile", "llama-3.1-8b-fp8-h100", "--routes", routes, "--admin-key-file", keyFile)
	s.waitHealthy(t)
	if code := adminPost(t, s.base, adminKey, "/admin/tenants", `{"name":"acme"}`, nil); code != 200 {
		t.Fatalf("create tenant: %d", code)
	}
	var key struct{ Key string }
	if code := adminPost(t, s.base, adminKey, "/admin/keys", `{"tenant":"acme"}`, &key); code != 200 || key.Key == "" {
		t.Fatalf("create key: %d", code)
	}
	waitUntil(t, "chat and small are ready", 60*time.Second, func() bool {
		return readyWithAdminKey(s.base, adminKey, "chat") && readyWithAdminKey(s.base, adminKey, "small")
	})

	prom := startPrometheus(t, prometheus, addr, rulesFile)
	waitUntil(t, "prometheus scrapes serve", 30*time.Second, func() bool {
		n, _, err := promQuery(prom, `up{job="stoke"} == 1`)
		return err == nil && n == 1
	})

	stop := make(chan struct{})
	var codes answerCounts
	load := monitoringLoad(s.base, key.Key, stop, &codes)
	stopLoad := sync.OnceFunc(func() { close(stop); load.Wait() })
	defer stopLoad()
	loadStart := time.Now()
	// A few seconds of load, scraped every second, before the first look.
	waitUntil(t, "5 s of load", 30*time.Second, func() bool { return time.Since(loadStart) > 5*time.Second })

	// Every recording rule's expression, the series the rules recorded
	// (some names are recorded by several rules, one per quantile) and
	// every dashboard target must answer samples.
	mustHave := append(append([]promExpr{}, records...), panels...)
	recorded := map[string]bool{}
	for _, r := range records {
		if name := strings.TrimPrefix(r.what, "recording rule "); !recorded[name] {
			recorded[name] = true
			mustHave = append(mustHave, promExpr{"recorded series " + name, name})
		}
	}
	var failures []string
	var nanOnly []string
	check := func() {
		failures, nanOnly = nil, nil
		for _, e := range mustHave {
			n, nans, err := promQuery(prom, e.expr)
			switch {
			case err != nil:
				failures = append(failures, fmt.Sprintf("%s: %v\n    %s", e.what, err, e.expr))
			case n == 0:
				failures = append(failures, fmt.Sprintf("%s: no samples\n    %s", e.what, e.expr))
			case nans == n:
				nanOnly = append(nanOnly, e.what)
			}
		}
		for _, e := range alerts {
			if _, _, err := promQuery(prom, e.expr); err != nil {
				failures = append(failures, fmt.Sprintf("%s: %v\n    %s", e.what, err, e.expr))
			}
		}
		for _, lv := range labelVars {
			var r struct {
				Status string   `json:"status"`
				Data   []string `json:"data"`
			}
			resp, err := http.Get(prom + "/api/v1/label/" + lv[1] + "/values?match[]=" + url.QueryEscape(lv[0]))
			if err == nil {
				err = json.NewDecoder(resp.Body).Decode(&r)
				resp.Body.Close()
			}
			if err != nil || r.Status != "success" || len(r.Data) == 0 {
				failures = append(failures, fmt.Sprintf("variable label_values(%s, %s): %v %v", lv[0], lv[1], r.Data, err))
			}
		}
		var rules promRules
		getJSON(t, prom+"/api/v1/rules", &rules)
		seen := 0
		for _, g := range rules.Data.Groups {
			for _, r := range g.Rules {
				seen++
				if r.Health != "ok" || r.LastError != "" {
					failures = append(failures, fmt.Sprintf("rule %s in group %s: health %q, lastError %q", r.Name, g.Name, r.Health, r.LastError))
				}
			}
		}
		if want := len(records) + len(alerts); seen != want {
			failures = append(failures, fmt.Sprintf("/api/v1/rules lists %d rules, the file has %d", seen, want))
		}
	}
	deadline := time.Now().Add(45 * time.Second)
	for check(); len(failures) > 0; check() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v of load (answers by status and model: %s), %d of %d checks fail:\n  %s", time.Since(loadStart).Round(time.Second),
				&codes, len(failures), len(mustHave)+len(alerts)+len(labelVars)+1, strings.Join(failures, "\n  "))
		}
		time.Sleep(500 * time.Millisecond)
	}
	stopLoad()
	t.Logf("load over %v, answers by status and model: %s", time.Since(loadStart).Round(100*time.Millisecond), &codes)
	t.Logf("checked: %d recording rules' expressions and the %d metric names they record, %d dashboard targets and %d variables answer samples; %d alerts' expressions evaluate; /api/v1/rules shows all %d rules healthy",
		len(records), len(recorded), len(panels), len(labelVars), len(alerts), len(records)+len(alerts))
	if len(nanOnly) > 0 {
		t.Logf("answered only NaN (a quantile or ratio over a window with no new observations): %s", strings.Join(nanOnly, "; "))
	}
	t.Logf("whole test: %v", time.Since(started).Round(100*time.Millisecond))
}
