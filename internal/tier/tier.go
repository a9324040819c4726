// Package tier names the cold-start tiers of DESIGN.md: how a replica was
// acquired, and where a load's weight bytes came from. It is the one type
// every room that speaks of tiers uses (the loader, the engine's wire
// types, the runtime manager, the scaler, the API and the bench).
package tier

import "fmt"

// Tier is one cold-start tier.
type Tier string

// The tiers. Hot, Wake and Start say how a replica was acquired; Cache and
// Bucket also say where a load's bytes came from, and Local a load from a
// directory on the node.
const (
	Hot    Tier = "t0"    // a ready replica was idle: nothing to load
	Wake   Tier = "t1"    // a sleeping replica woke
	Cache  Tier = "t2"    // weights streamed from the node cache
	Bucket Tier = "t3"    // weights streamed from the bucket
	Start  Tier = "t4"    // a runtime was started first
	Local  Tier = "local" // weights read from a directory on this node
)

// Benchable returns the tiers a cold-start bench can prepare a deployment
// for, in order.
func Benchable() []Tier { return []Tier{Wake, Cache, Bucket, Start} }

// Parse returns the benchable tier named s ("t1" … "t4").
func Parse(s string) (Tier, error) {
	for _, t := range Benchable() {
		if string(t) == s {
			return t, nil
		}
	}
	return "", fmt.Errorf("tier %q is not t1, t2, t3 or t4", s)
}
