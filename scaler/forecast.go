package scaler

import "math"

// forecaster predicts a deployment's arrival rate with additive Holt-Winters
// (triple exponential smoothing) over fixed-width count buckets:
//
//	level_t  = α(x_t − s_{t−m}) + (1−α)(level_{t−1} + trend_{t−1})
//	trend_t  = β(level_t − level_{t−1}) + (1−β)trend_{t−1}
//	s_t      = γ(x_t − level_t) + (1−γ)s_{t−m}
//	x̂_{t+h}  = level_t + h·trend_t + s_{t+h−m}
//
// Seasonal slots are indexed by absolute bucket number modulo m, so a daily
// period lines up with the clock. Until one full season has been seen the
// model runs as plain Holt (double exponential smoothing, no seasonal term)
// while the raw counts are kept; when the m-th bucket closes the seasonal
// indices are initialised from that first season's deviations from its
// mean, the level to the mean and the trend to zero.
type forecaster struct {
	bucket             int64 // nanoseconds
	alpha, beta, gamma float64
	season             []float64

	started bool
	cur     int64   // bucket being counted
	count   float64 // arrivals in cur
	closed  int     // closed buckets, counted up to len(season)
	level   float64
	trend   float64
}

func newForecaster(s Seasonality) *forecaster {
	m := int(s.Period / s.Bucket)
	return &forecaster{
		bucket: int64(s.Bucket),
		alpha:  s.Alpha, beta: s.Beta, gamma: s.Gamma,
		season: make([]float64, m),
	}
}

func (f *forecaster) seasonal() bool { return f.closed >= len(f.season) }

func (f *forecaster) slot(k int64) *float64 {
	m := int64(len(f.season))
	return &f.season[((k%m)+m)%m]
}

// advance closes every bucket before the one holding t. Buckets without
// arrivals close with zero. A gap longer than two seasons only replays the
// last two, which is all the smoothing would remember anyway.
func (f *forecaster) advance(t int64) {
	k := floorDiv(t, f.bucket)
	if !f.started {
		f.started, f.cur = true, k
		return
	}
	if k <= f.cur {
		return
	}
	f.observe(f.cur, f.count)
	f.count = 0
	next := f.cur + 1
	if limit := 2 * int64(len(f.season)); k-next > limit {
		next = k - limit
	}
	for ; next < k; next++ {
		f.observe(next, 0)
	}
	f.cur = k
}

// add counts n arrivals at t.
func (f *forecaster) add(t int64, n float64) {
	f.advance(t)
	if floorDiv(t, f.bucket) == f.cur { // arrivals stamped in the past are dropped
		f.count += n
	}
}

func (f *forecaster) observe(k int64, x float64) {
	if !f.seasonal() {
		*f.slot(k) = x // raw count, turned into a seasonal index below
		if f.closed == 0 {
			f.level = x
		} else {
			prev := f.level
			f.level = f.alpha*x + (1-f.alpha)*(f.level+f.trend)
			f.trend = f.beta*(f.level-prev) + (1-f.beta)*f.trend
		}
		f.closed++
		if f.seasonal() {
			var mean float64
			for _, v := range f.season {
				mean += v
			}
			mean /= float64(len(f.season))
			for i := range f.season {
				f.season[i] -= mean
			}
			f.level, f.trend = mean, 0
		}
		return
	}
	s := f.slot(k)
	prev := f.level
	f.level = f.alpha*(x-*s) + (1-f.alpha)*(f.level+f.trend)
	f.trend = f.beta*(f.level-prev) + (1-f.beta)*f.trend
	*s = f.gamma*(x-f.level) + (1-f.gamma)**s
}

// rate forecasts arrivals per second in the bucket holding t, and whether
// any bucket has closed yet (without one there is nothing to forecast).
func (f *forecaster) rate(t int64) (float64, bool) {
	if f.closed == 0 {
		return 0, false
	}
	k := floorDiv(t, f.bucket)
	h := float64(max(k-(f.cur-1), 1)) // steps ahead of the last closed bucket
	x := f.level + h*f.trend
	if f.seasonal() {
		x += *f.slot(k)
	}
	if !(x > 0) || math.IsInf(x, 0) {
		return 0, true
	}
	return x / (float64(f.bucket) / 1e9), true
}

// seasonalRise is the seasonal term alone of the forecast for the bucket
// holding t, in arrivals per second: how far above the level that slot of
// the season usually runs (0 for a slot below it, and before a full season
// has been seen).
func (f *forecaster) seasonalRise(t int64) float64 {
	if !f.seasonal() {
		return 0
	}
	x := *f.slot(floorDiv(t, f.bucket))
	if !(x > 0) || math.IsInf(x, 0) {
		return 0
	}
	return x / (float64(f.bucket) / 1e9)
}
