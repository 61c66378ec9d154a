package simsession

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/generate"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
)

// TinyKey is the session metadata key of a prefill that runs a tiny model
// (generate.Spec, as FormatTiny spells it): the decode process decodes
// every room's tokens from its pool and compares them with the model's.
const TinyKey = "kvstream-tiny"

// maxTinyText bounds the spec's text before it is parsed.
const maxTinyText = 512

// maxTinyRooms bounds the rooms whose pages and expected tokens the decode
// process keeps at once (each room's until its last chunk).
const maxTinyRooms = 256

// FormatTiny spells a spec for TinyKey: space-separated name=value fields,
// every one of them, in a fixed order.
func FormatTiny(s generate.Spec) string {
	return fmt.Sprintf("model=%s seed=%d requests=%d prompt-tokens=%d new-tokens=%d page-size=%d page-order=%s",
		s.Model, s.Seed, s.Requests, s.PromptTokens, s.NewTokens, s.PageSize, s.Order)
}

// ParseTiny reads FormatTiny's text, which comes from the network: every
// field exactly once, nothing else, numbers that fit, and a spec that
// passes generate.Spec.Check (a known model, sizes within what a decode
// process checks). Errors are marked system.ErrBadInput and name the
// field.
func ParseTiny(text string) (generate.Spec, error) {
	var s generate.Spec
	seed := field{"seed", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return errors.Newf("seed %.32q: want a number from 0 to %d", v, uint64(math.MaxUint64))
		}
		s.Seed = n
		return nil
	}}
	if err := parseFields(TinyKey, text, maxTinyText, []field{
		textField("model", &s.Model), seed, intField("requests", &s.Requests), intField("prompt-tokens", &s.PromptTokens),
		intField("new-tokens", &s.NewTokens), intField("page-size", &s.PageSize), orderField(&s.Order),
	}); err != nil {
		return s, err
	}
	if err := s.Check(); err != nil {
		return s, errors.Mark(errors.Newf("%s %.64q: %v", TinyKey, text, err), system.ErrBadInput)
	}
	return s, nil
}

// RoomCheck is a decode process's token check of one room: the tokens it
// decoded from its pool against the model's own.
type RoomCheck struct {
	Prefill string
	Room    uint64
	Model   string
	// First is the token fed to the decode: the model's own first token,
	// since a chunk notice carries none of the prefill's.
	First int
	tinylm.Verdict
	// Err is why the room could not be checked (a position that never
	// arrived, a pool of another layout), or nil.
	Err error
}

// OK reports whether the room was checked and its tokens are the model's,
// logits within tinylm.LogitTolerance.
func (r RoomCheck) OK() bool { return r.Err == nil && r.Verdict.OK() }

// String is the line a decode process prints for the room.
func (r RoomCheck) String() string {
	head := fmt.Sprintf("decode: room %d of %s (%s)", r.Room, r.Prefill, r.Model)
	if r.Err != nil {
		return fmt.Sprintf("%s: tokens_equal: false: %v", head, r.Err)
	}
	line := fmt.Sprintf("%s: tokens_equal: %v, %d tokens after the model's first token %d, min_top1_margin: %.3g, max_logit_diff: %.3g",
		head, r.OK(), len(r.Tokens), r.First, r.MinMargin, r.MaxLogitDiff)
	if !r.Equal && r.FirstDiff >= 0 {
		line += fmt.Sprintf("; step %d decoded %s, the model %s; decoded %s, the model's %s",
			r.FirstDiff, at(r.Tokens, r.FirstDiff), at(r.Reference, r.FirstDiff), ints(r.Tokens), ints(r.Reference))
	}
	return line
}

func at(v []int, i int) string {
	if i < len(v) {
		return strconv.Itoa(v[i])
	}
	return "nothing"
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// TokenSummary adds up a decode process's room checks.
type TokenSummary struct {
	// Rooms were checked; Equal of them had the model's tokens.
	Rooms, Equal int
	// MinMargin is the smallest top-1 margin of the model's picks over the
	// rooms checked; MaxLogitDiff the largest logit difference.
	MinMargin, MaxLogitDiff float64
	// FirstMismatch describes the first room that was not OK, or "".
	FirstMismatch string
}

// OK reports whether every room checked had the model's tokens.
func (s *TokenSummary) OK() bool { return s.Equal == s.Rooms }

func (s *TokenSummary) add(r RoomCheck) {
	if s.Rooms == 0 {
		s.MinMargin = math.Inf(1)
	}
	s.Rooms++
	if r.OK() {
		s.Equal++
	} else if s.FirstMismatch == "" {
		s.FirstMismatch = r.String()
	}
	if r.Err == nil {
		s.MinMargin = min(s.MinMargin, r.MinMargin)
		s.MaxLogitDiff = max(s.MaxLogitDiff, r.MaxLogitDiff)
	}
}

// String is the summary's part of the decode process's summary line.
func (s *TokenSummary) String() string {
	return fmt.Sprintf("tokens: %d rooms checked, %d equal, min_top1_margin %.3g, max_logit_diff %.3g, tokens_equal: %v",
		s.Rooms, s.Equal, s.MinMargin, s.MaxLogitDiff, s.OK())
}

// tinyChecks is a decode process's token checks: per room in flight the
// pages its chunks named and the model's expected tokens (computed off the
// control plane from the room's first chunk on), and, at its last chunk,
// the decode from the pool. Verify calls it, with the pool's lock held.
type tinyChecks struct {
	mu     sync.Mutex
	models map[string]*tinylm.Model
	rooms  map[tinyRoomKey]*tinyRoom
	onRoom func(RoomCheck)
	sum    TokenSummary
	wg     sync.WaitGroup // the expectations being computed
}

type tinyRoomKey struct {
	session *decode.Session
	room    uint64
}

// tinyRoom is a room in flight.
type tinyRoom struct {
	pages    map[int]int // request position -> decode page
	ready    chan struct{}
	expected *tinylm.Expected // once ready
	err      error
}

// model returns the preset's model, drawn once.
func (t *tinyChecks) model(name string) (*tinylm.Model, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.models[name]; m != nil {
		return m, nil
	}
	cfg, err := tinylm.Preset(name)
	if err != nil {
		return nil, err
	}
	m, err := tinylm.New(cfg)
	if err != nil {
		return nil, err
	}
	if t.models == nil {
		t.models = map[string]*tinylm.Model{}
	}
	t.models[name] = m
	return m, nil
}

// admit checks a tiny prefill's spec before anything is sized.
func admitTiny(text string) error {
	_, err := ParseTiny(text)
	return err
}

// verify takes a successful chunk of a tiny session: it records where the
// chunk's positions landed, and at the room's last chunk decodes the
// room's tokens from pool and compares them with the model's. A room whose
// tokens differ, or that cannot be checked, fails here.
func (t *tinyChecks) verify(ss *decode.Session, c decode.Chunk, pool *testbed.Pool) error {
	spec, err := ParseTiny(ss.Metadata()[TinyKey])
	if err != nil {
		return err
	}
	m, err := t.model(spec.Model)
	if err != nil {
		return err
	}
	side := spec.Side(m)
	promptPages := (spec.PromptTokens + spec.PageSize - 1) / spec.PageSize
	switch {
	case c.Room < 1 || c.Room > uint64(spec.Requests):
		return errors.Newf("room %d: the prefill announced rooms 1 to %d", c.Room, spec.Requests)
	case pool == nil:
		return errors.Newf("room %d: no pool", c.Room)
	case pool.Buffers() != side.Layers*side.Kinds() || pool.ItemLen != side.ItemLen():
		return errors.Newf("room %d: a pool of %d buffers of %d bytes a page; %s at page size %d lays out %d of %d",
			c.Room, pool.Buffers(), pool.ItemLen, spec.Model, spec.PageSize, side.Layers*side.Kinds(), side.ItemLen())
	}
	for _, pos := range c.Positions {
		if pos >= promptPages {
			return errors.Newf("room %d: position %d is beyond the prompt's %d pages", c.Room, pos, promptPages)
		}
	}
	key := tinyRoomKey{ss, c.Room}
	t.mu.Lock()
	r := t.rooms[key]
	if r == nil {
		if len(t.rooms) >= maxTinyRooms {
			t.mu.Unlock()
			return errors.Newf("room %d: %d rooms of tiny models are in flight already", c.Room, maxTinyRooms)
		}
		r = &tinyRoom{pages: map[int]int{}, ready: make(chan struct{})}
		if t.rooms == nil {
			t.rooms = map[tinyRoomKey]*tinyRoom{}
		}
		t.rooms[key] = r
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer close(r.ready)
			r.expected, r.err = m.Expect(spec.RoomPrompt(m, c.Room), spec.NewTokens)
		}()
	}
	for i, pos := range c.Positions {
		r.pages[pos] = c.DstPages[i]
	}
	if c.Last {
		delete(t.rooms, key)
	}
	t.mu.Unlock()
	if !c.Last {
		return nil
	}

	<-r.ready
	rc := RoomCheck{Prefill: ss.Prefill(), Room: c.Room, Model: spec.Model}
	if rc.Err = r.err; rc.Err == nil {
		rc.First = r.expected.First.Token
		rc.Verdict, rc.Err = check(m, &side, pool, r, spec, rc.First)
	}
	t.mu.Lock()
	t.sum.add(rc)
	onRoom := t.onRoom
	t.mu.Unlock()
	if onRoom != nil {
		onRoom(rc)
	}
	switch {
	case rc.Err != nil:
		return errors.Wrapf(rc.Err, "room %d: tokens not checked", c.Room)
	case !rc.OK():
		return errors.Newf("room %d: tokens_equal: false: the decode from the transferred KV differs from the model (step %d; max_logit_diff %.3g)",
			c.Room, rc.FirstDiff, rc.MaxLogitDiff)
	}
	return nil
}

// check decodes the room's tokens from pool, fed first, and compares them
// with the model's. The prompt's full pages are read where they landed;
// the slots after the prompt (its last page's rest, the new tokens' pages)
// are a scratch pool's, the last page copied there first, so that the
// decode writes nothing into the decode pool.
func check(m *tinylm.Model, side *reshard.Side, pool *testbed.Pool, r *tinyRoom, spec generate.Spec, first int) (tinylm.Verdict, error) {
	ps := spec.PageSize
	promptPages := (spec.PromptTokens + ps - 1) / ps
	full := spec.PromptTokens / ps
	total := (spec.PromptTokens + spec.NewTokens + ps - 1) / ps
	buffers := side.Layers * side.Kinds()
	scratch := tinylm.NewMemPool(buffers, int(side.ItemLen()), total-full)
	cache := &tinylm.Cache{Side: *side}
	for pos := 0; pos < total; pos++ {
		if pos >= full {
			cache.Pages = append(cache.Pages, tinylm.PageRef{Pool: scratch, Page: pos - full})
			continue
		}
		pg, ok := r.pages[pos]
		if !ok {
			return tinylm.Verdict{}, errors.Newf("position %d never arrived", pos)
		}
		cache.Pages = append(cache.Pages, tinylm.PageRef{Pool: pool, Page: pg})
	}
	if full < promptPages {
		pg, ok := r.pages[full]
		if !ok {
			return tinylm.Verdict{}, errors.Newf("position %d never arrived", full)
		}
		for b := 0; b < buffers; b++ {
			copy(scratch.Page(b, 0), pool.Page(b, pg))
		}
	}
	return m.CheckAgainst([][]*tinylm.Cache{{cache}}, r.expected, first)
}

// setOnRoom sets what hears of every room checked.
func (t *tinyChecks) setOnRoom(f func(RoomCheck)) {
	t.mu.Lock()
	t.onRoom = f
	t.mu.Unlock()
}

// summary returns the checks so far, or nil when no room was checked.
func (t *tinyChecks) summary() *TokenSummary {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sum.Rooms == 0 {
		return nil
	}
	s := t.sum
	return &s
}

// forget drops the rooms in flight: the pool is gone, and every session
// that reported them with it.
func (t *tinyChecks) forget() {
	t.mu.Lock()
	clear(t.rooms)
	t.mu.Unlock()
}

// ended drops the rooms a session left in flight (rooms that failed
// before their last chunk).
func (t *tinyChecks) ended(s *decode.Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.rooms {
		if k.session == s {
			delete(t.rooms, k)
		}
	}
}
