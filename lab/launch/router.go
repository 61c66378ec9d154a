package launch

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
)

// router runs the batches: for each it picks a decode instance (from the
// followed membership, in memory), waits for that instance to be free (one
// batch per instance at a time; batches on different instances run at
// once), starts it and waits for its end in the background. Its
// dependencies are functions, so that it runs without processes in tests.
type router struct {
	// decodes are the decode instances' ids, in order.
	decodes []string
	// live lists the instances a batch may go to now (registered with the
	// address their running process announced); running says whether
	// id's process runs (it may come back), or exited for good.
	live    func() ([]string, error)
	running func(id string) bool
	// avoid, if set, says whether id is being drained on purpose (a
	// rolling restart): no new batch goes to it while another instance
	// is live.
	avoid func(id string) bool
	// stop reports a reason to start no more batches ("" to go on).
	stop func() string
	// start starts batch b on dec and returns what await waits on, or
	// nil when dec is avoided now (checked with the start, atomically).
	start func(b int, dec string) *batch
	// await returns when bt ended (or its bound ran out, or hard ended).
	await func(hard context.Context, bt *batch)
	// note records a line of the report; waiting says what the router
	// waits for.
	note    func(format string, args ...any)
	waiting func(what string)
	// pickWait bounds the wait for the intended instance to come back;
	// poll is how often the membership is read meanwhile.
	pickWait, poll time.Duration
}

// run schedules batches 0..n-1 until accept ends (the drain) or stop
// says so, and returns once every started batch ended: the batches it
// started and why it stopped early ("" if it did not).
func (r *router) run(accept, hard context.Context, n int) (started int, why string) {
	// slots[dec] holds one token while dec runs a batch. The map belongs
	// to this goroutine: each batch's goroutine gets its own slot's
	// channel, never the map.
	slots := map[string]chan struct{}{}
	var wg sync.WaitGroup
	defer wg.Wait()
	for b := range n {
		if why = r.stop(); why != "" {
			r.note("batch %d and later not started: %s", b, why)
			return started, why
		}
		var dec string
		var slot chan struct{}
		var bt *batch
		for {
			var err error
			dec, err = r.pick(accept, b)
			if err != nil {
				why = err.Error()
				if accept.Err() != nil {
					why = "draining"
				}
				r.note("batch %d and later not started: %s", b, why)
				return started, why
			}
			slot = slots[dec]
			if slot == nil {
				slot = make(chan struct{}, 1)
				slots[dec] = slot
			}
			select {
			case slot <- struct{}{}:
			case <-accept.Done():
				r.note("batch %d and later not started: draining", b)
				return started, "draining"
			}
			if why = r.stop(); why != "" {
				<-slot
				r.note("batch %d and later not started: %s", b, why)
				return started, why
			}
			if !r.avoided(dec) {
				if bt = r.start(b, dec); bt != nil {
					break
				}
			}
			// It began draining while the batch waited for it.
			<-slot
		}
		started++
		wg.Go(func() {
			defer func() { <-slot }()
			r.await(hard, bt)
		})
	}
	return started, ""
}

// pick chooses batch b's decode instance: the instances in id order, b
// modulo their number. While the intended instance's process runs but is
// not live yet (a restart waiting for its old lease), the batch waits for
// it, up to pickWait; if its process is gone for good, or the wait ran
// out, the batch goes to another live instance.
func (r *router) pick(ctx context.Context, b int) (string, error) {
	want := r.decodes[b%len(r.decodes)]
	deadline := time.Now().Add(r.pickWait)
	said := time.Time{}
	for {
		live, err := r.live()
		if err != nil {
			return "", err
		}
		coming := r.running(want)
		avoided := r.avoided(want)
		live = slices.DeleteFunc(live, r.avoided)
		switch {
		case slices.Contains(live, want):
			return want, nil
		case len(live) > 0 && (avoided || !coming || time.Now().After(deadline)):
			return live[b%len(live)], nil
		case time.Now().After(deadline):
			return "", errors.Mark(errors.Newf("no live decode instance within %v", r.pickWait), cluster.ErrNotFound)
		}
		if time.Since(said) >= 5*time.Second {
			said = time.Now()
			r.waiting(fmt.Sprintf("batch %d waits for decode instance %s to be registered again (live: %v; up to %v)",
				b, want, live, time.Until(deadline).Round(time.Second)))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(r.poll): // membership changes are rare; this waits out a restart
		}
	}
}

// avoided says whether id is being drained on purpose (router.avoid).
func (r *router) avoided(id string) bool { return r.avoid != nil && r.avoid(id) }
