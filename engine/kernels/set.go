package kernels

import (
	"fmt"
	"os"
	"strings"
)

// EnvKernels names the environment variable that forces a kernel set
// ("avx512", "avx2" or "generic") for every pool made without naming one.
const EnvKernels = "STOKE_KERNELS"

// setNames lists every kernel set, fastest first, whether or not this
// build and CPU can run it.
var setNames = []string{"avx512", "avx2", "generic"}

// Name is the set's name: "avx512", "avx2" or "generic".
func (s *Set) Name() string { return s.name }

// Supported lists the kernel sets this build and CPU can run, fastest
// first; the portable set is always last.
func Supported() []*Set {
	var sets []*Set
	for _, s := range []*Set{avx512Kernels, avx2Kernels} {
		if s != nil {
			sets = append(sets, s)
		}
	}
	return append(sets, &genericKernels)
}

// Lookup returns the kernel set called name, or an error that says why it
// cannot be used: an unknown name, or a set this CPU or build cannot run.
func Lookup(name string) (*Set, error) {
	for _, s := range Supported() {
		if s.name == name {
			return s, nil
		}
	}
	for _, n := range setNames {
		if n == name {
			return nil, fmt.Errorf("kernel set %q cannot run on this CPU or build (supported: %s)", name, supportedNames())
		}
	}
	return nil, fmt.Errorf("unknown kernel set %q (want one of %s; supported here: %s)",
		name, strings.Join(setNames, ", "), supportedNames())
}

// Select returns the kernel set an engine should use: the one called name
// when it is not empty, else the one STOKE_KERNELS names when that is set,
// else the fastest this CPU runs.
func Select(name string) (*Set, error) {
	if name != "" {
		return Lookup(name)
	}
	if env := os.Getenv(EnvKernels); env != "" {
		s, err := Lookup(env)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvKernels, err)
		}
		return s, nil
	}
	return Supported()[0], nil
}

func supportedNames() string {
	var names []string
	for _, s := range Supported() {
		names = append(names, s.name)
	}
	return strings.Join(names, ", ")
}

// fastest is the fastest set this CPU runs, for conversions that every
// set performs exactly (and so identically).
var fastest = Supported()[0]

// defaultSet is what Select("") returned when the package was initialised,
// or nil with defaultErr when STOKE_KERNELS named a set that cannot run.
// Both are set once and never change.
var defaultSet, defaultErr = Select("")

// Default returns the kernel set pools use when none is named: the one
// STOKE_KERNELS named when the process started, else the fastest this CPU
// runs. Its error reports a STOKE_KERNELS that names no usable set.
func Default() (*Set, error) { return defaultSet, defaultErr }

// mustDefault returns the default set; it panics with the reason when
// STOKE_KERNELS names no usable set, since computing with another set
// than the one asked for would be a silent lie. Commands check Default at
// startup to report it as an error instead.
func mustDefault() *Set {
	if defaultErr != nil {
		panic("kernels: " + defaultErr.Error())
	}
	return defaultSet
}
