// Command pause is the sandbox ("pause") container of the test clusters'
// pods: it holds the pod's namespaces and waits for SIGTERM or SIGINT.
// package kubetest builds it into an image, since the clusters cannot pull
// registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
