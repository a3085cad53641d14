// The node's sandbox ("pause") image entry point, built here because no registry serves one:
// it holds the pod's namespaces open, reaps orphaned children (SIGCHLD ignored) and exits on
// SIGINT or SIGTERM, which is all containerd asks of a sandbox process.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signal.Ignore(syscall.SIGCHLD)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
