package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"

	"github.com/cockroachdb/errors"
)

// Stream is a trace read one record at a time: its header, then its
// records in order, each checked against the header's geometry
// (Header.CheckRecord) before it is returned. Next returns io.EOF after
// the last record.
type Stream interface {
	Header() Header
	Next() (Record, error)
}

// readBuffer is the reader's buffer: a line longer than it is assembled
// from pieces, never beyond the line's bound.
const readBuffer = 64 << 10

// Reader reads a trace as a stream: it holds one line at a time, at most
// the line bound (MaxHeaderLine for the header, then the header's
// LineBound), so a trace of any length or a hostile line takes
// bounded memory. Blank lines and lines starting with '#' are comments.
type Reader struct {
	br     *bufio.Reader
	header Header
	line   int    // lines read so far
	bound  int    // of the next line, in bytes (without its newline)
	buf    []byte // the current line; reused
	err    error  // sticky: a stream that failed stays failed
}

// NewReader reads and validates a trace's header: the format version, then
// every bound of Header.Validate (an engine's Config.Validate, or a decode
// server's DecodeConfig.Validate). Nothing is read beyond the header line.
func NewReader(r io.Reader) (*Reader, error) {
	rd := &Reader{br: bufio.NewReaderSize(r, readBuffer), bound: MaxHeaderLine}
	text, err := rd.nextLine()
	if err == io.EOF {
		return nil, errors.New("trace: no header line (is this a kvstream trace?)")
	}
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	if err := dec.Decode(&rd.header); err != nil {
		return nil, errors.Wrapf(err, "trace line %d: header", rd.line)
	}
	if err := trailing(dec); err != nil {
		return nil, errors.Wrapf(err, "trace line %d: header", rd.line)
	}
	if rd.header.Format == 1 {
		return nil, errors.Newf("trace line %d: format version 1: recorded by an older kvstream, before registrations were recorded ahead of their chunks; this kvstream reads version %d (replay it with the kvstream that recorded it)", rd.line, Version)
	}
	if rd.header.Format == 2 && rd.header.Side != SideDecode {
		return nil, errors.Newf("trace line %d: format version 2: recorded by an older kvstream, whose rooms stopped their chunks and made the forward actor forget them; this kvstream reads version %d (replay it with the kvstream that recorded it)", rd.line, Version)
	}
	if rd.header.Format != Version && (rd.header.Format != 2 || rd.header.Side != SideDecode) {
		return nil, errors.Newf("trace line %d: format version %d, this kvstream reads version %d", rd.line, rd.header.Format, Version)
	}
	if rd.header.Records < 0 {
		return nil, errors.Newf("trace line %d: trace header: records %d: negative", rd.line, rd.header.Records)
	}
	if err := rd.header.Validate(); err != nil {
		return nil, errors.Wrapf(err, "trace line %d", rd.line)
	}
	if err := checkName("engine_version", rd.header.EngineVersion); err != nil {
		return nil, errors.Wrapf(err, "trace line %d: trace header", rd.line)
	}
	rd.bound = rd.header.LineBound()
	return rd, nil
}

// Header returns the validated header.
func (r *Reader) Header() Header { return r.header }

// LineBound is the longest record line this reader accepts, in bytes.
func (r *Reader) LineBound() int { return r.bound }

// Next returns the next record, checked against the header's geometry; an
// error names the line. io.EOF after the last record.
func (r *Reader) Next() (Record, error) {
	if r.err != nil {
		return Record{}, r.err
	}
	rec, err := r.next()
	if err != nil {
		r.err = err
	}
	return rec, err
}

func (r *Reader) next() (Record, error) {
	text, err := r.nextLine()
	if err != nil {
		return Record{}, err
	}
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	if err := dec.Decode(&rec); err != nil {
		return Record{}, errors.Wrapf(err, "trace line %d", r.line)
	}
	if err := trailing(dec); err != nil {
		return Record{}, errors.Wrapf(err, "trace line %d", r.line)
	}
	rec.Line = r.line
	if rec.Actor == "" || rec.Type == "" {
		return Record{}, errors.Newf("trace line %d: record without actor or type", r.line)
	}
	if err := r.header.CheckRecord(&rec); err != nil {
		return Record{}, errors.Wrapf(err, "trace line %d (record %d, %s %s)", r.line, rec.Seq, rec.Actor, rec.Type)
	}
	if r.header.Side == "" {
		// The renames are the engine's: a decode core's effects have names
		// of their own (its Reply is not an engine's).
		for i, e := range rec.Effects {
			rec.Effects[i] = currentEffect(e)
		}
	}
	return rec, nil
}

// trailing refuses anything after a line's JSON object.
func trailing(dec *json.Decoder) error {
	if dec.More() {
		return errors.New("data after the JSON object")
	}
	return nil
}

// nextLine returns the next line that is not a comment, trimmed; io.EOF at
// the end. A line longer than the bound is an error as soon as the bound
// is passed: at most the bound plus one read buffer is ever read of it.
func (r *Reader) nextLine() ([]byte, error) {
	for {
		raw, err := r.readLine()
		if err != nil {
			return nil, err
		}
		text := bytes.TrimSpace(raw)
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		return text, nil
	}
}

func (r *Reader) readLine() ([]byte, error) {
	r.line++
	r.buf = r.buf[:0]
	for {
		frag, err := r.br.ReadSlice('\n')
		n := len(frag)
		if err == nil {
			n-- // the newline
		}
		if len(r.buf)+n > r.bound {
			return nil, errors.Newf("trace line %d: longer than the bound of %d bytes (the header's geometry; see docs/TRACES.md)", r.line, r.bound)
		}
		r.buf = append(r.buf, frag...)
		switch {
		case err == nil:
			return r.buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF && len(r.buf) > 0:
			return r.buf, nil
		case err == io.EOF:
			r.line--
			return nil, io.EOF
		default:
			return nil, errors.Wrapf(err, "trace line %d", r.line)
		}
	}
}
