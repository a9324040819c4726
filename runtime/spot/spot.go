// Package spot watches for EC2 spot interruption notices. A Watcher polls
// the instance metadata service (IMDS) path spot/instance-action with
// IMDSv2 session tokens through aws-sdk-go-v2's feature/ec2/imds client, at
// an endpoint of the caller's choosing (AWS's amazon-ec2-metadata-mock in
// tests), and hands each new notice to a callback: serve drains the node's
// spot slots with it before the instance goes away.
package spot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/prometheus/client_golang/prometheus"
)

// Path is the instance metadata path of the spot interruption notice:
// 404 while none is posted, else the notice's JSON.
const Path = "spot/instance-action"

// The actions a notice announces.
const (
	ActionTerminate = "terminate"
	ActionStop      = "stop"
	ActionHibernate = "hibernate"
)

// DefaultInterval is the time between two polls when Options.Interval is
// unset: AWS's advice for spot/instance-action.
const DefaultInterval = 5 * time.Second

// errorLogInterval is how often a watcher that keeps failing to read IMDS
// logs it: the first failure, then one line per interval with the count of
// failed polls since the last line.
const errorLogInterval = time.Minute

// Notice is a spot interruption notice, as IMDS posts it:
// {"action":"terminate","time":"2026-01-02T15:04:05Z"}.
type Notice struct {
	// Action is ActionTerminate, ActionStop or ActionHibernate.
	Action string `json:"action"`
	// Time is when the action happens (zero when the notice has none or
	// it does not parse).
	Time time.Time `json:"time"`
}

// Options configure a Watcher.
type Options struct {
	// Endpoint is the IMDS endpoint, e.g. http://127.0.0.1:1338; empty is
	// the SDK's default (http://169.254.169.254, or
	// AWS_EC2_METADATA_SERVICE_ENDPOINT).
	Endpoint string
	// Interval is the time between two polls (DefaultInterval when 0).
	Interval time.Duration
	// OnNotice receives each new notice once, on the watcher's goroutine:
	// the next poll waits for it, so long work belongs in a goroutine of
	// its own. A notice is new when the previous poll that reached IMDS
	// found none, or one with another action: the time alone does not
	// make it new (AWS's metadata mock moves it at every read).
	OnNotice func(ctx context.Context, n Notice)
	// Logger receives the watcher's logs (slog.Default() when nil).
	Logger *slog.Logger
	// Registerer, when set, receives stoke_spot_interruption_notices_total
	// {action} and stoke_spot_imds_polls_total{result}.
	Registerer prometheus.Registerer
}

// Watcher polls IMDS for spot interruption notices.
type Watcher struct {
	opts    Options
	client  *imds.Client
	log     *slog.Logger
	notices *prometheus.CounterVec
	polls   *prometheus.CounterVec
}

// New returns a watcher; it polls nothing until Run.
func New(opts Options) (*Watcher, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Endpoint != "" {
		u, err := url.Parse(opts.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("new spot watcher: endpoint %q is not an http:// or https:// URL", opts.Endpoint)
		}
	}
	w := &Watcher{
		opts: opts,
		// IMDSv2 only: a watcher that cannot get a session token says so
		// instead of falling back to IMDSv1's unauthenticated reads. One
		// quick retry a poll (a session token gone stale needs one): the
		// next poll is the real retry.
		client: imds.New(imds.Options{Endpoint: opts.Endpoint, EnableFallback: aws.FalseTernary,
			Retryer: retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts, o.MaxBackoff = 2, 200*time.Millisecond })}),
		log: opts.Logger.With("component", "spot-watcher", "endpoint", endpointName(opts.Endpoint)),
		notices: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_spot_interruption_notices_total",
			Help: "Spot interruption notices seen on the instance metadata service, by action (terminate, stop, hibernate)."}, []string{"action"}),
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stoke_spot_imds_polls_total",
			Help: "Polls of the instance metadata service for spot interruption notices, by result (none, notice, error)."}, []string{"result"}),
	}
	if opts.Registerer != nil {
		if err := errors.Join(opts.Registerer.Register(w.notices), opts.Registerer.Register(w.polls)); err != nil {
			return nil, fmt.Errorf("new spot watcher: register metrics: %w", err)
		}
	}
	return w, nil
}

// endpointName is the endpoint as logs name it.
func endpointName(endpoint string) string {
	if endpoint == "" {
		return "default"
	}
	return endpoint
}

// Check polls IMDS once: the notice posted now, if any. A 404 is no
// notice, not an error.
func (w *Watcher) Check(ctx context.Context) (Notice, bool, error) {
	out, err := w.client.GetMetadata(ctx, &imds.GetMetadataInput{Path: Path})
	if err != nil {
		var status interface{ HTTPStatusCode() int }
		if errors.As(err, &status) && status.HTTPStatusCode() == http.StatusNotFound {
			return Notice{}, false, nil
		}
		return Notice{}, false, fmt.Errorf("read %s from IMDS: %w", Path, err)
	}
	defer out.Content.Close()
	raw, err := io.ReadAll(io.LimitReader(out.Content, 64<<10))
	if err != nil {
		return Notice{}, false, fmt.Errorf("read %s from IMDS: %w", Path, err)
	}
	n, err := ParseNotice(raw)
	if err != nil {
		return Notice{}, false, fmt.Errorf("read %s from IMDS: %w", Path, err)
	}
	return n, true, nil
}

// ParseNotice reads a notice's JSON. An action is required; a time that
// is missing or is not RFC 3339 leaves Time zero, so that a malformed time
// never hides a notice.
func ParseNotice(raw []byte) (Notice, error) {
	var v struct {
		Action string `json:"action"`
		Time   string `json:"time"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return Notice{}, fmt.Errorf("parse spot notice %q: %w", truncate(raw), err)
	}
	if v.Action == "" {
		return Notice{}, fmt.Errorf("parse spot notice %q: no action", truncate(raw))
	}
	n := Notice{Action: v.Action}
	if t, err := time.Parse(time.RFC3339, v.Time); err == nil {
		n.Time = t
	}
	return n, nil
}

// truncate cuts a body for an error message.
func truncate(raw []byte) string {
	if len(raw) > 200 {
		return string(raw[:200]) + "…"
	}
	return string(raw)
}

// Run polls IMDS once an interval until ctx ends, calling OnNotice for
// each new notice. Failures to reach IMDS are logged (the first one, then
// at most once a minute, and when it answers again) and polling goes on.
// It returns nil once ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	w.log.Info("watching for spot interruption notices", "interval", w.opts.Interval)
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	var posted *Notice // the notice the last poll that reached IMDS found
	var errs errorLog
	for {
		n, ok, err := w.Check(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			w.polls.WithLabelValues("error").Inc()
			errs.failed(w.log, err)
		case !ok:
			w.polls.WithLabelValues("none").Inc()
			errs.succeeded(w.log)
			if posted != nil {
				w.log.Info("spot interruption notice withdrawn", "action", posted.Action)
			}
			posted = nil
		default:
			w.polls.WithLabelValues("notice").Inc()
			errs.succeeded(w.log)
			if posted == nil || posted.Action != n.Action {
				w.notices.WithLabelValues(actionLabel(n.Action)).Inc()
				attrs := []any{"action", n.Action}
				if !n.Time.IsZero() {
					attrs = append(attrs, "time", n.Time, "in", time.Until(n.Time).Round(time.Second))
				}
				w.log.Warn("spot interruption notice", attrs...)
				if w.opts.OnNotice != nil {
					w.opts.OnNotice(ctx, n)
				}
			}
			posted = &n
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// actionLabel is an action as a metric label: one of the known actions,
// else "unknown" (the label's values stay few whatever IMDS says).
func actionLabel(action string) string {
	switch action {
	case ActionTerminate, ActionStop, ActionHibernate:
		return action
	}
	return "unknown"
}

// errorLog rate-limits a watcher's logs of failed polls.
type errorLog struct {
	failing bool
	logged  time.Time // when the last failure was logged
	since   int       // failed polls since then
	total   int       // failed polls in a row
}

func (e *errorLog) failed(log *slog.Logger, err error) {
	e.total++
	e.since++
	if e.failing && time.Since(e.logged) < errorLogInterval {
		return
	}
	log.Warn("cannot read spot interruption notices from IMDS; polling on", "err", err, "failed_polls", e.since)
	e.failing, e.logged, e.since = true, time.Now(), 0
}

func (e *errorLog) succeeded(log *slog.Logger) {
	if e.failing {
		log.Info("IMDS answers again", "failed_polls", e.total)
	}
	*e = errorLog{}
}
