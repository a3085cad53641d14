// Command tsdbgen writes synthetic dcgm-exporter history straight into a Prometheus TSDB block.
//
// The audit benchmark needs hours of history for thousands of GPUs; as OpenMetrics text for
// promtool that is gigabytes and many minutes, so the benchmark writes the block directly with
// Prometheus's own TSDB package. Series look exactly like dcgm-exporter's with honorLabels
// true: pod/namespace/container, gpu, UUID, device, modelName, Hostname.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/go-kit/log"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

type metric struct {
	name string
	// value for job j, gpu g at sample i
	value func(j, g, i int) float64
}

func main() {
	out := flag.String("out", "", "Prometheus data directory to write the block into")
	jobs := flag.Int("jobs", 100, "number of jobs")
	podsPerJob := flag.Int("pods-per-job", 1, "pods per job, named <job>-<index>")
	gpus := flag.Int("gpus", 8, "GPUs per pod")
	endUnix := flag.Int64("end", time.Now().Unix(), "end of the history, unix seconds")
	duration := flag.Duration("duration", 2*time.Hour, "length of the history")
	interval := flag.Duration("interval", 30*time.Second, "sample interval")
	namespace := flag.String("namespace", "bench", "namespace label of every pod")
	namespaces := flag.Int("namespaces", 0, "spread the jobs over this many namespaces <namespace>-NNN (job j in j mod N); 0: all in -namespace")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "tsdbgen: -out is required")
		os.Exit(2)
	}
	// A job's profile is fixed by its index, so the expected means are known to the benchmark.
	frac := func(j int) float64 { return float64(j%10) / 10.0 }
	metrics := []metric{
		{"DCGM_FI_DEV_GPU_UTIL", func(j, g, i int) float64 { return 100 }},
		{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", func(j, g, i int) float64 { return 0.99 }},
		{"DCGM_FI_PROF_SM_ACTIVE", func(j, g, i int) float64 { return 0.05 + 0.9*frac(j) }},
		{"DCGM_FI_PROF_SM_OCCUPANCY", func(j, g, i int) float64 { return 0.5 * frac(j) }},
		{"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", func(j, g, i int) float64 { return 0.6 * frac(j) }},
		{"DCGM_FI_PROF_DRAM_ACTIVE", func(j, g, i int) float64 { return 0.2 + 0.01*math.Sin(float64(i)) }},
		{"DCGM_FI_DEV_POWER_USAGE", func(j, g, i int) float64 { return 200 + 400*frac(j) }},
		{"DCGM_FI_DEV_FB_USED", func(j, g, i int) float64 { return 40000 }},
		{"DCGM_FI_DEV_SM_CLOCK", func(j, g, i int) float64 { return 1980 }},
	}
	end := *endUnix * 1000
	step := interval.Milliseconds()
	n := int(duration.Milliseconds() / step)
	start := end - int64(n-1)*step
	blockSize := (end - start + step) * 2
	logger := log.NewNopLogger()
	w, err := tsdb.NewBlockWriter(logger, *out, blockSize)
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	app := w.Appender(ctx)
	written := 0
	for j := 0; j < *jobs; j++ {
		for p := 0; p < *podsPerJob; p++ {
			pod := fmt.Sprintf("job-%05d-%d", j, p)
			ns := *namespace
			if *namespaces > 0 {
				ns = fmt.Sprintf("%s-%03d", *namespace, j%*namespaces)
			}
			host := fmt.Sprintf("node-%04d-%d", j, p)
			for g := 0; g < *gpus; g++ {
				for _, m := range metrics {
					lbls := labels.FromStrings(
						"__name__", m.name, "namespace", ns, "pod", pod, "container", "main",
						"gpu", fmt.Sprint(g), "UUID", fmt.Sprintf("GPU-%08d-%04d-%04d", j, p, g),
						"device", fmt.Sprintf("nvidia%d", g), "modelName", "NVIDIA H200", "Hostname", host,
					)
					var ref storage.SeriesRef
					for i := 0; i < n; i++ {
						r, err := app.Append(ref, lbls, start+int64(i)*step, m.value(j, g, i))
						if err != nil {
							fail(err)
						}
						ref = r
						written++
					}
				}
			}
		}
		if j%50 == 49 {
			if err := app.Commit(); err != nil {
				fail(err)
			}
			app = w.Appender(ctx)
			fmt.Fprintf(os.Stderr, "tsdbgen: %d/%d jobs, %d samples\n", j+1, *jobs, written)
		}
	}
	if err := app.Commit(); err != nil {
		fail(err)
	}
	id, err := w.Flush(ctx)
	if err != nil {
		fail(err)
	}
	if err := w.Close(); err != nil {
		fail(err)
	}
	fmt.Printf("%s %d\n", id, written)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tsdbgen:", err)
	os.Exit(1)
}
