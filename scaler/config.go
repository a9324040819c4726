package scaler

import (
	"fmt"
	"math"
	"time"
)

// Defaults applied by NewAutoscaler to zero-valued Config fields. The
// windows and the panic threshold are Knative KPA's; the target is a
// container-concurrency-style in-flight target sized for an LLM replica.
const (
	DefaultTargetConcurrency    = 8.0
	DefaultStableWindow         = 60 * time.Second
	DefaultPanicWindow          = 6 * time.Second
	DefaultPanicThreshold       = 2.0
	DefaultScaleDownDelay       = 30 * time.Second
	DefaultTTFTSLO              = 800 * time.Millisecond
	DefaultMaxWaitingPerReplica = 4
	DefaultKVUsageHigh          = 0.9
	DefaultGranularity          = time.Second
	DefaultSeasonPeriod         = 24 * time.Hour
	DefaultSeasonBucket         = time.Minute
	DefaultAlpha                = 0.3
	DefaultBeta                 = 0.05
	DefaultGamma                = 0.3
)

// Upper bounds on ring sizes, so a mistyped granularity cannot make one
// Autoscaler allocate gigabytes.
const (
	maxWindowBuckets = 1 << 16
	maxSeasonBuckets = 1 << 20
)

// Config tunes one deployment's Autoscaler. Zero-valued fields take the
// Default* values (see each field for the exceptions where zero means
// something).
type Config struct {
	// TargetConcurrency is the in-flight requests one replica should carry
	// (Knative's container-concurrency target). Default 8.
	TargetConcurrency float64
	// StableWindow is the averaging window of the concurrency signal in
	// normal mode, the least time panic mode lasts after its condition
	// last held, and how long a deployment must have nothing in flight,
	// buffered or arriving to count as idle. Default 60 s.
	StableWindow time.Duration
	// PanicWindow is the short averaging window used to detect and follow
	// bursts. Default 6 s; must not exceed StableWindow.
	PanicWindow time.Duration
	// PanicThreshold starts panic mode when the panic-window desired count
	// is at least this multiple of max(ready, 1). Default 2.0; must be >= 1.
	PanicThreshold float64
	// ScaleDownDelay is how long the recommended count must stay lower
	// before the decision drops (an idle deployment reaches MinReplicas
	// StableWindow + ScaleDownDelay after its last request). Default 30 s;
	// negative disables the delay.
	ScaleDownDelay time.Duration
	// MinReplicas is the floor of every decision (0 allows scale to zero).
	MinReplicas int
	// MaxReplicas is the ceiling of every decision; 0 means unbounded.
	MaxReplicas int
	// TTFTSLO is the deployment's time-to-first-token SLO (the spec's
	// ttft_slo), used as the most a request may wait in the activator's
	// buffer for capacity before its first token is at risk: a queue-wait
	// p90 (Signals.QueueWaitP90) above it asks for one more replica than
	// are ready. Default 800 ms.
	TTFTSLO time.Duration
	// MaxWaitingPerReplica is how many engine-queued requests one replica
	// absorbs: waiting requests beyond MaxWaitingPerReplica × ready ask for
	// one more replica per MaxWaitingPerReplica of excess (rounded up).
	// Default 4.
	MaxWaitingPerReplica int
	// KVUsageHigh is the KV-cache usage (0..1) above which one more replica
	// is asked for. Default 0.9.
	KVUsageHigh float64
	// ColdStart is the deployment's measured time from "scale up" to a ready
	// replica; the forecaster looks this far ahead. Zero looks at the
	// current forecast bucket only.
	ColdStart time.Duration
	// Lead is added to ColdStart for how far ahead the predictive floor
	// looks: the time between two decisions, so that a floor the forecast
	// raises is acted on a cold start before the demand, not up to one
	// decision later. Zero adds nothing.
	Lead time.Duration
	// NoPrediction turns the predictive floor off: replicas follow the
	// demand seen, never the forecast.
	NoPrediction bool
	// AvgLatency is the mean request duration used by the predictive floor
	// (Little's law) when Signals.AvgLatency is zero. When both are zero the
	// predictive floor is off.
	AvgLatency time.Duration
	// Granularity is the bucket width of the concurrency ring. Default 1 s;
	// must not exceed PanicWindow.
	Granularity time.Duration
	// Seasonality configures the arrival-rate forecaster.
	Seasonality Seasonality
}

// Seasonality configures the Holt-Winters (additive) arrival-rate
// forecaster behind the predictive floor.
type Seasonality struct {
	// Period is the length of one season, e.g. a day. Default 24 h; must be
	// a whole number of Buckets.
	Period time.Duration
	// Bucket is the width of one arrival-count bucket. Default 1 min.
	Bucket time.Duration
	// Alpha, Beta and Gamma are the level, trend and seasonal smoothing
	// factors, each in (0, 1]. Defaults 0.3, 0.05, 0.3.
	Alpha, Beta, Gamma float64
}

// DefaultConfig returns the configuration NewAutoscaler uses for a zero
// Config, with every default filled in.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

func (c Config) withDefaults() Config {
	if c.TargetConcurrency == 0 {
		c.TargetConcurrency = DefaultTargetConcurrency
	}
	if c.StableWindow == 0 {
		c.StableWindow = DefaultStableWindow
	}
	if c.PanicWindow == 0 {
		c.PanicWindow = DefaultPanicWindow
	}
	if c.PanicThreshold == 0 {
		c.PanicThreshold = DefaultPanicThreshold
	}
	if c.ScaleDownDelay == 0 {
		c.ScaleDownDelay = DefaultScaleDownDelay
	}
	if c.TTFTSLO == 0 {
		c.TTFTSLO = DefaultTTFTSLO
	}
	if c.MaxWaitingPerReplica == 0 {
		c.MaxWaitingPerReplica = DefaultMaxWaitingPerReplica
	}
	if c.KVUsageHigh == 0 {
		c.KVUsageHigh = DefaultKVUsageHigh
	}
	if c.Granularity == 0 {
		c.Granularity = DefaultGranularity
	}
	s := &c.Seasonality
	if s.Period == 0 {
		s.Period = DefaultSeasonPeriod
	}
	if s.Bucket == 0 {
		s.Bucket = DefaultSeasonBucket
	}
	if s.Alpha == 0 {
		s.Alpha = DefaultAlpha
	}
	if s.Beta == 0 {
		s.Beta = DefaultBeta
	}
	if s.Gamma == 0 {
		s.Gamma = DefaultGamma
	}
	return c
}

// Validate reports the first field of c (after defaults) that cannot work.
func (c Config) Validate() error {
	c = c.withDefaults()
	finitePos := func(v float64) bool { return v > 0 && !math.IsInf(v, 1) }
	switch {
	case !finitePos(c.TargetConcurrency):
		return fmt.Errorf("scaler config: TargetConcurrency %v must be a positive number", c.TargetConcurrency)
	case c.StableWindow < 0:
		return fmt.Errorf("scaler config: StableWindow %v must be positive", c.StableWindow)
	case c.PanicWindow < 0 || c.PanicWindow > c.StableWindow:
		return fmt.Errorf("scaler config: PanicWindow %v must be positive and at most StableWindow %v", c.PanicWindow, c.StableWindow)
	case !(c.PanicThreshold >= 1) || math.IsInf(c.PanicThreshold, 1):
		return fmt.Errorf("scaler config: PanicThreshold %v must be a number >= 1", c.PanicThreshold)
	case c.MinReplicas < 0:
		return fmt.Errorf("scaler config: MinReplicas %d must not be negative", c.MinReplicas)
	case c.MaxReplicas < 0:
		return fmt.Errorf("scaler config: MaxReplicas %d must not be negative (0 = unbounded)", c.MaxReplicas)
	case c.MaxReplicas > 0 && c.MinReplicas > c.MaxReplicas:
		return fmt.Errorf("scaler config: MinReplicas %d exceeds MaxReplicas %d", c.MinReplicas, c.MaxReplicas)
	case c.TTFTSLO < 0:
		return fmt.Errorf("scaler config: TTFTSLO %v must be positive", c.TTFTSLO)
	case c.MaxWaitingPerReplica < 0:
		return fmt.Errorf("scaler config: MaxWaitingPerReplica %d must be positive", c.MaxWaitingPerReplica)
	case !(c.KVUsageHigh > 0 && c.KVUsageHigh <= 1):
		return fmt.Errorf("scaler config: KVUsageHigh %v must be in (0, 1]", c.KVUsageHigh)
	case c.ColdStart < 0:
		return fmt.Errorf("scaler config: ColdStart %v must not be negative", c.ColdStart)
	case c.Lead < 0:
		return fmt.Errorf("scaler config: Lead %v must not be negative", c.Lead)
	case c.AvgLatency < 0:
		return fmt.Errorf("scaler config: AvgLatency %v must not be negative", c.AvgLatency)
	case c.Granularity < 0 || c.Granularity > c.PanicWindow:
		return fmt.Errorf("scaler config: Granularity %v must be positive and at most PanicWindow %v", c.Granularity, c.PanicWindow)
	case c.StableWindow/c.Granularity > maxWindowBuckets:
		return fmt.Errorf("scaler config: StableWindow %v / Granularity %v exceeds %d buckets", c.StableWindow, c.Granularity, maxWindowBuckets)
	}
	s := c.Seasonality
	switch {
	case s.Bucket < 0:
		return fmt.Errorf("scaler config: Seasonality.Bucket %v must be positive", s.Bucket)
	case s.Period < s.Bucket || s.Period%s.Bucket != 0:
		return fmt.Errorf("scaler config: Seasonality.Period %v must be a positive multiple of Bucket %v", s.Period, s.Bucket)
	case s.Period/s.Bucket > maxSeasonBuckets:
		return fmt.Errorf("scaler config: Seasonality.Period %v / Bucket %v exceeds %d buckets", s.Period, s.Bucket, maxSeasonBuckets)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"Alpha", s.Alpha}, {"Beta", s.Beta}, {"Gamma", s.Gamma}} {
		if !(f.v > 0 && f.v <= 1) {
			return fmt.Errorf("scaler config: Seasonality.%s %v must be in (0, 1]", f.name, f.v)
		}
	}
	return nil
}
