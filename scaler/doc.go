// Package scaler decides how many replicas each deployment should run.
//
// It is a pure, clock-injected decision package: nothing here starts
// goroutines, sleeps or reads the wall clock. The caller (the activator and
// serve wiring) feeds an Autoscaler with concurrency samples (Record), request
// arrivals (RecordArrival) and engine signals, and asks it for a Decision at
// the times of its choosing, passing "now" explicitly every time. Tests drive
// it with a fake clock.
//
// The concurrency rule follows Knative's KPA: a time-weighted average of
// in-flight requests over a stable window (60 s) and a panic window (6 s),
// divided by a per-replica target; panic mode starts when the panic-window
// demand reaches PanicThreshold × ready replicas, lasts at least a stable
// window after the condition last held, and never scales down. The other
// demand signals can only raise the count above the ready replicas, and
// only while requests are in flight or buffered: engine-queued requests
// beyond what the ready replicas absorb, KV-cache usage, and the p90 time
// requests waited in the activator's buffer for a replica (queueing delay,
// against the TTFT SLO; the router ages its samples out after the stable
// window). A deployment with nothing in flight, buffered or arriving for a
// stable window is idle and recommends zero. A Holt-Winters forecaster of
// arrival rate, looking ahead by the deployment's cold-start time, sets a
// predictive floor. Decreases are delayed by ScaleDownDelay; the result is
// clamped to [MinReplicas, MaxReplicas].
package scaler
