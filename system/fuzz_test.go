package system

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/cockroachdb/errors"
)

// FuzzRegister feeds arbitrary registrations to an engine: each must be
// accepted or refused with an error marked ErrBadInput, never panic, and a
// refused one must change no state.
func FuzzRegister(f *testing.F) {
	f.Add(uint64(1), 0, 16, true, []byte{0, 1, 2, 3}, []byte{4, 5, 6, 7}, uint8(0), 4)
	f.Add(uint64(2), 16, 40, false, []byte{1, 2}, []byte{0, 1, 2, 3, 4, 5}, uint8(1), 0)
	f.Add(uint64(3), 3, 1, false, []byte{}, []byte{}, uint8(2), -1)
	f.Add(uint64(4), 0, 64, true, []byte{15, 15, 200, 7}, []byte{9}, uint8(3), 16)
	e := newEngine(f, nil)
	f.Cleanup(func() { _ = e.Close() })
	f.Fuzz(func(t *testing.T, room uint64, start, end int, last bool, src, dst []byte, infos uint8, total int) {
		spec := ChunkSpec{Room: room, Start: start, End: end, Last: last, TotalPages: total,
			SrcPages: pagesOf(src), Infos: infosOf(infos, pagesOf(dst))}
		had := e.HasRoom(room)
		reg, err := e.Register(context.Background(), spec)
		if err != nil {
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("registration refused without ErrBadInput: %v", err)
			}
			if e.HasRoom(room) != had {
				t.Fatalf("a refused registration changed the room's state")
			}
			return
		}
		if !reg.Existing && !e.HasRoom(room) {
			t.Fatalf("an accepted registration left no room")
		}
		if err := e.Drop(context.Background(), room); err != nil {
			t.Fatalf("drop after register: %v", err)
		}
	})
}

// pagesOf reads pairs of bytes as page ids, so that negative-free but
// out-of-range and duplicate pages both occur.
func pagesOf(b []byte) []int {
	out := make([]int, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		out = append(out, int(int16(binary.LittleEndian.Uint16(b[i:]))))
	}
	if len(b)%2 == 1 {
		out = append(out, int(b[len(b)-1]))
	}
	return out
}

// infosOf builds 0..3 destinations from the low bits: peer "d" or an unknown
// one, dummy or not.
func infosOf(bits uint8, dst []int) []DecodeInfo {
	var out []DecodeInfo
	for i := 0; i < int(bits%4); i++ {
		peer := "d"
		if bits&(1<<(2+i)) != 0 {
			peer = "nobody"
		}
		out = append(out, DecodeInfo{Peer: peer, DstPages: dst, Dummy: bits&(1<<(5+i%3)) != 0})
	}
	return out
}
