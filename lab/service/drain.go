package service

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"go.uber.org/zap"
)

// InFlight counts work in progress (sessions, batches, rooms) so that a
// drain can wait for it: a WaitGroup that can be read and waited on with
// a deadline. The zero value is ready to use.
type InFlight struct {
	mu      sync.Mutex
	n       int
	started int64
	idle    chan struct{} // closed while n == 0; nil means "closed"
}

// Add records one more piece of work; Done ends it.
func (f *InFlight) Add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
	f.started++
}

// Done ends one piece of work. More Dones than Adds panic, as a
// WaitGroup's would: it is a bookkeeping bug.
func (f *InFlight) Done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		panic("service.InFlight: Done without Add")
	}
	f.n--
	if f.n == 0 {
		close(f.idle)
	}
}

// Count is the work in progress now.
func (f *InFlight) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// Started is how much work was ever added.
func (f *InFlight) Started() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

// Wait returns nil once nothing is in flight, or ctx's error. Work added
// after the count fell to zero is waited for too: a session accepted
// while a drain waits (before its Stop took effect) is in flight, and the
// idle moment that came before it is no end of the work.
func (f *InFlight) Wait(ctx context.Context) error {
	for {
		f.mu.Lock()
		idle := f.idle
		n := f.n
		f.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Drain is a service's orderly end. Run performs its steps in order:
//
//  1. Ops.SetDraining: /readyz fails, so that routers stop sending work;
//  2. Stop: stop accepting work (deregister from discovery, refuse new
//     sessions);
//  3. Wait: let the work in flight finish, within Timeout; if it did not,
//     Cut stops what is left (within GoodbyeMin), which counts as lost;
//  4. Goodbye: tell the peers (end sessions cleanly), within what is left
//     of Timeout, and at least GoodbyeMin;
//
// and reports what was in flight when it began and what was left when it
// gave up. Every step is optional.
type Drain struct {
	// Timeout bounds Wait and Goodbye together (DefaultDrainTimeout when
	// zero).
	Timeout time.Duration
	// GoodbyeMin is the least Goodbye is given even when Wait used the
	// whole Timeout (DefaultGoodbyeMin when zero).
	GoodbyeMin time.Duration
	Ops        *Ops
	Stop       func(ctx context.Context) error
	// InFlight says how much work is in flight (for the report); Wait
	// returns when none is.
	InFlight func() int
	Wait     func(ctx context.Context) error
	// Cut stops the work Wait did not see finish, and returns once it
	// stopped (or ctx ended).
	Cut     func(ctx context.Context)
	Goodbye func(ctx context.Context) error
	// Reason is what started the drain, for the report ("terminated").
	Reason string
	Log    *zap.Logger
}

// Defaults of Drain.
const (
	DefaultDrainTimeout = 30 * time.Second
	DefaultGoodbyeMin   = 5 * time.Second
)

// DrainReport is what a drain did.
type DrainReport struct {
	Reason string
	// InFlight is the work in flight when the drain began; Left what was
	// still in flight when it ended (0: the drain lost nothing).
	InFlight, Left int
	Took           time.Duration
	// TimedOut: Wait did not return within the timeout (or the drain was
	// abandoned); Errors: what Stop, Wait and Goodbye returned.
	TimedOut bool
	Errors   []string
}

// Lost reports whether the drain left work unfinished: the exit status of
// a service that was asked to stop.
func (r DrainReport) Lost() bool { return r.Left > 0 || r.TimedOut }

func (r DrainReport) String() string {
	reason := r.Reason
	if reason == "" {
		reason = "stop"
	}
	s := fmt.Sprintf("drain (%s): %d in flight at the start, %d left, %.2f s", reason, r.InFlight, r.Left, r.Took.Seconds())
	if r.TimedOut {
		s += ", timed out"
	}
	if len(r.Errors) > 0 {
		s += "; " + strings.Join(r.Errors, "; ")
	}
	return s
}

// Err is nil when the drain lost nothing, else an error that says what.
func (r DrainReport) Err() error {
	if !r.Lost() {
		return nil
	}
	return errors.Newf("the drain lost work in flight: %s", r)
}

// Run drains; hard (a second signal) cuts every step short.
func (d Drain) Run(hard context.Context) DrainReport {
	if d.Timeout <= 0 {
		d.Timeout = DefaultDrainTimeout
	}
	if d.GoodbyeMin <= 0 {
		d.GoodbyeMin = DefaultGoodbyeMin
	}
	log := d.Log
	if log == nil {
		log = zap.NewNop()
	}
	start := time.Now()
	rep := DrainReport{Reason: d.Reason}
	count := func() int {
		if d.InFlight == nil {
			return 0
		}
		return d.InFlight()
	}
	note := func(step string, err error) {
		if err != nil {
			rep.Errors = append(rep.Errors, step+": "+err.Error())
		}
	}
	if d.Ops != nil {
		d.Ops.SetDraining()
	}
	rep.InFlight = count()
	log.Info("drain: begins", zap.String("reason", d.Reason), zap.Int("in_flight", rep.InFlight), zap.Duration("timeout", d.Timeout))
	ctx, cancel := context.WithTimeout(hard, d.Timeout)
	defer cancel()
	if d.Stop != nil {
		note("stop accepting", d.Stop(ctx))
	}
	if d.Wait != nil {
		if err := d.Wait(ctx); err != nil {
			rep.TimedOut = true
			note("wait for the work in flight", err)
		}
	}
	rep.Left = count()
	// What is left of the time, or GoodbyeMin when the wait took it all.
	rest := func() (context.Context, context.CancelFunc) {
		if ctx.Err() != nil && hard.Err() == nil {
			return context.WithTimeout(hard, d.GoodbyeMin)
		}
		return ctx, func() {}
	}
	if rep.TimedOut && d.Cut != nil {
		cctx, cancel := rest()
		d.Cut(cctx)
		cancel()
	}
	if d.Goodbye != nil {
		gctx, cancel := rest()
		note("goodbye", d.Goodbye(gctx))
		cancel()
	}
	rep.Took = time.Since(start)
	if rep.Lost() {
		log.Warn("drain: work in flight lost", zap.String("report", rep.String()))
	} else {
		log.Info("drain: done", zap.String("report", rep.String()))
	}
	return rep
}
