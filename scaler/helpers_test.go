package scaler

import "math"

func nan() float64 { return math.NaN() }
func inf() float64 { return math.Inf(1) }

func ninf() float64 { return math.Inf(-1) }
