package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/stokehq/stoke/engine/kernels"
)

// addKernelsFlag adds --kernels, the CPU kernel set a command computes with.
func addKernelsFlag(fl *pflag.FlagSet, name *string) {
	fl.StringVar(name, "kernels", "", "CPU kernel set: avx512, avx2 or generic (default: $"+kernels.EnvKernels+", else the fastest this CPU runs)")
}

// selectKernels returns the kernel set --kernels names (name), else the one
// STOKE_KERNELS names, else the fastest this CPU runs. An unknown set, or
// one this CPU cannot run, is an error naming where it came from; so is a
// bad STOKE_KERNELS even when --kernels overrides it, since pools made
// without a set (kernels.NewPool) would refuse to start later.
func selectKernels(name string) (*kernels.Set, error) {
	if _, err := kernels.Default(); err != nil {
		return nil, err
	}
	ks, err := kernels.Select(name)
	if err != nil && name != "" {
		return nil, fmt.Errorf("--kernels: %w", err)
	}
	return ks, err
}
