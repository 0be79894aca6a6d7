//! Validation of request headers against the negotiated session (pure).

use crate::protocol::*;

/// What the validator needs to know about the negotiated session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TransmissionParams {
    pub size: u64,
    pub read_only: bool,
    /// Replies are chunks (structured replies or extended headers).
    pub structured: bool,
    /// Extended headers: 32-byte requests, `NBD_CMD_FLAG_PAYLOAD_LEN`.
    pub extended: bool,
    /// At least one metadata context was negotiated.
    pub has_meta_context: bool,
    pub min_block: u32,
    pub max_payload: u32,
}

/// A validated request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// `df`: NBD_CMD_FLAG_DF, at most one content chunk.
    Read {
        offset: u64,
        length: u32,
        df: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Disc,
    Flush,
    Trim {
        offset: u64,
        length: u64,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u64,
    },
    WriteZeroes {
        offset: u64,
        length: u64,
        no_hole: bool,
        fast: bool,
        fua: bool,
    },
    BlockStatus {
        offset: u64,
        length: u64,
        req_one: bool,
    },
}

/// Why a request is refused (error value and a message for structured replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub errno: u32,
    pub msg: &'static str,
}

pub(crate) fn reject(errno: u32, msg: &'static str) -> Rejection {
    Rejection { errno, msg }
}

/// Bytes of a request header: 32 with extended headers, else 28.
pub(crate) fn header_len(extended: bool) -> usize {
    if extended {
        EXTENDED_REQUEST_HEADER_LEN
    } else {
        REQUEST_HEADER_LEN
    }
}

/// Decode a request header of the negotiated form; the other form's magic
/// is an error like any other (proto.md: once extended headers are
/// negotiated the client MUST use them, and only then).
pub(crate) fn parse_header(b: &[u8], extended: bool) -> Result<ExtendedRequestHeader, ProtocolError> {
    let truncated = || ProtocolError::Truncated { needed: header_len(extended), got: b.len() };
    if extended {
        let hb = b.get(..EXTENDED_REQUEST_HEADER_LEN).and_then(|x| x.try_into().ok()).ok_or_else(truncated)?;
        parse_extended_request_header(hb)
    } else {
        let hb = b.get(..REQUEST_HEADER_LEN).and_then(|x| x.try_into().ok()).ok_or_else(truncated)?;
        parse_request_header(hb).map(ExtendedRequestHeader::from)
    }
}

/// Payload bytes that follow the header on the wire, whether or not the
/// request is valid: a WRITE's length; with extended headers also the
/// length of any request flagged `NBD_CMD_FLAG_PAYLOAD_LEN`.
///
/// proto.md says an extended WRITE MUST carry the flag, but qemu 10.0's
/// client sends its writes without it (and qemu's server takes both), so
/// a WRITE's length is its payload either way.
pub(crate) fn payload_len(h: &ExtendedRequestHeader, extended: bool) -> u64 {
    let has_payload = h.command == NBD_CMD_WRITE || (extended && h.flags & NBD_CMD_FLAG_PAYLOAD_LEN != 0);
    if has_payload {
        h.length
    } else {
        0
    }
}

/// Validate a request header against the session (pure).
pub(crate) fn validate_request(h: &ExtendedRequestHeader, p: &TransmissionParams) -> Result<Request, Rejection> {
    let Some(cmd) = Command::from_u16(h.command) else {
        return Err(reject(NBD_EINVAL, "unknown command"));
    };
    // With extended headers a WRITE may carry NBD_CMD_FLAG_PAYLOAD_LEN
    // (see payload_len: it is accepted with or without); on other commands
    // the flag announces a payload none of them takes here
    // (NBD_FLAG_BLOCK_STATUS_PAYLOAD is not offered), so it is invalid and
    // the payload is dropped.
    let payload_flag = if p.extended && cmd == Command::Write { NBD_CMD_FLAG_PAYLOAD_LEN } else { 0 };
    if h.flags & !(cmd.allowed_flags(p.structured) | payload_flag) != 0 {
        return Err(reject(NBD_EINVAL, "unknown or invalid command flags"));
    }
    let fua = h.flags & NBD_CMD_FLAG_FUA != 0;
    let (offset, length) = (h.offset, h.length);
    match cmd {
        Command::Disc => return Ok(Request::Disc),
        Command::Flush => {
            if offset != 0 || length != 0 {
                return Err(reject(NBD_EINVAL, "flush offset and length must be zero"));
            }
            return Ok(Request::Flush);
        }
        Command::Write | Command::Trim | Command::WriteZeroes if p.read_only => {
            return Err(reject(NBD_EPERM, "export is read-only"));
        }
        Command::BlockStatus if !p.has_meta_context => {
            return Err(reject(NBD_EINVAL, "no metadata context was negotiated"));
        }
        _ => {}
    }
    check_range(cmd, offset, length, p)?;
    Ok(match cmd {
        // Read and write lengths were bounded by max_payload (a u32) above.
        Command::Read => Request::Read { offset, length: length as u32, df: h.flags & NBD_CMD_FLAG_DF != 0 },
        Command::Write => Request::Write { offset, length: length as u32, fua },
        Command::Trim => Request::Trim { offset, length, fua },
        Command::Cache => Request::Cache { offset, length },
        Command::WriteZeroes => Request::WriteZeroes {
            offset,
            length,
            no_hole: h.flags & NBD_CMD_FLAG_NO_HOLE != 0,
            fast: h.flags & NBD_CMD_FLAG_FAST_ZERO != 0,
            fua,
        },
        Command::BlockStatus => Request::BlockStatus { offset, length, req_one: h.flags & NBD_CMD_FLAG_REQ_ONE != 0 },
        // Returned early above.
        Command::Disc => Request::Disc,
        Command::Flush => Request::Flush,
    })
}

/// Length, end, payload size and alignment of a request with a range.
fn check_range(cmd: Command, offset: u64, length: u64, p: &TransmissionParams) -> Result<(), Rejection> {
    if length == 0 {
        return Err(reject(NBD_EINVAL, "zero-length request"));
    }
    let Some(end) = offset.checked_add(length) else {
        return Err(reject(NBD_EINVAL, "offset + length overflows"));
    };
    if end > p.size {
        return Err(match cmd {
            Command::Write | Command::WriteZeroes => reject(NBD_ENOSPC, "write beyond the end of the export"),
            _ => reject(NBD_EINVAL, "request beyond the end of the export"),
        });
    }
    if matches!(cmd, Command::Read | Command::Write) && length > p.max_payload as u64 {
        // proto.md, "Size constraints": for WRITE, and READ with simple
        // replies, "the client MUST NOT request a length larger than the
        // maximum payload size" — a plain invalid request (EINVAL). With
        // structured replies a READ's reply payload is the server's to
        // split, and NBD_CMD_READ says "the server is also permitted to
        // reject large read requests up front with NBD_EOVERFLOW, so a
        // client should be prepared to retry with smaller requests"; the
        // error section allows EOVERFLOW only where documented, so WRITE
        // keeps EINVAL. Commands without payload (TRIM, WRITE_ZEROES,
        // CACHE, BLOCK_STATUS) "MAY request an effect length larger than
        // the maximum payload size" and are served whole.
        return Err(match cmd {
            Command::Read if p.structured => reject(NBD_EOVERFLOW, "read longer than the maximum payload size"),
            _ => reject(NBD_EINVAL, "request exceeds the maximum payload size"),
        });
    }
    if p.min_block > 1 && cmd != Command::BlockStatus {
        let m = p.min_block as u64;
        #[allow(clippy::manual_is_multiple_of)] // is_multiple_of needs Rust 1.87
        if offset % m != 0 || (length % m != 0 && end != p.size) {
            return Err(reject(NBD_EINVAL, "request not aligned to the minimum block size"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> TransmissionParams {
        TransmissionParams {
            size: 1 << 20,
            read_only: false,
            structured: true,
            extended: false,
            has_meta_context: true,
            min_block: 1,
            max_payload: 32 << 20,
        }
    }

    fn hdr(command: u16, flags: u16, offset: u64, length: u32) -> ExtendedRequestHeader {
        RequestHeader { flags, command, handle: 7, offset, length }.into()
    }

    fn ext_hdr(command: u16, flags: u16, offset: u64, length: u64) -> ExtendedRequestHeader {
        ExtendedRequestHeader { flags, command, handle: 7, offset, length }
    }

    #[test]
    fn validate_ok() {
        let p = params();
        assert_eq!(
            validate_request(&hdr(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 4096), &p),
            Ok(Request::Read { offset: 0, length: 4096, df: true })
        );
        assert_eq!(
            validate_request(&hdr(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, (1 << 20) - 512, 512), &p),
            Ok(Request::Write { offset: (1 << 20) - 512, length: 512, fua: true })
        );
        assert_eq!(validate_request(&hdr(NBD_CMD_DISC, 0, 0, 0), &p), Ok(Request::Disc));
        assert_eq!(validate_request(&hdr(NBD_CMD_FLUSH, 0, 0, 0), &p), Ok(Request::Flush));
        assert_eq!(
            validate_request(&hdr(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO, 0, 8192), &p),
            Ok(Request::WriteZeroes { offset: 0, length: 8192, no_hole: true, fast: true, fua: false })
        );
        assert_eq!(
            validate_request(&hdr(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 0, 1 << 20), &p),
            Ok(Request::BlockStatus { offset: 0, length: 1 << 20, req_one: true })
        );
        assert_eq!(validate_request(&hdr(NBD_CMD_CACHE, 0, 0, 1), &p), Ok(Request::Cache { offset: 0, length: 1 }));
        // Trim/zero lengths may exceed the payload maximum.
        let mut small = p;
        small.max_payload = 4096;
        assert!(validate_request(&hdr(NBD_CMD_TRIM, 0, 0, 1 << 20), &small).is_ok());
    }

    #[test]
    fn validate_errors() {
        let p = params();
        let err = |h: ExtendedRequestHeader, p: &TransmissionParams| validate_request(&h, p).unwrap_err().errno;
        assert_eq!(err(hdr(99, 0, 0, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_RESIZE, 0, 0, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_READ, 1 << 9, 0, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_WRITE, NBD_CMD_FLAG_DF, 0, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_READ, NBD_CMD_FLAG_PAYLOAD_LEN, 0, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_READ, 0, 0, 0), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_WRITE, 0, 0, 0), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_READ, 0, u64::MAX, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_WRITE, 0, u64::MAX - 10, 4096), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_READ, 0, (1 << 20) - 1, 2), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_WRITE, 0, 1 << 20, 1), &p), NBD_ENOSPC);
        assert_eq!(err(hdr(NBD_CMD_WRITE_ZEROES, 0, 1 << 20, 1), &p), NBD_ENOSPC);
        assert_eq!(err(hdr(NBD_CMD_TRIM, 0, 1 << 20, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_BLOCK_STATUS, 0, 1 << 20, 1), &p), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_FLUSH, 0, 1, 0), &p), NBD_EINVAL);
        let mut small = p;
        small.max_payload = 4096;
        // Beyond the maximum payload: a structured READ may get EOVERFLOW,
        // a simple READ and a WRITE are invalid, the others are served.
        assert_eq!(err(hdr(NBD_CMD_READ, 0, 0, 8192), &small), NBD_EOVERFLOW);
        assert_eq!(err(hdr(NBD_CMD_WRITE, 0, 0, 8192), &small), NBD_EINVAL);
        small.structured = false;
        assert_eq!(err(hdr(NBD_CMD_READ, 0, 0, 8192), &small), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_WRITE, 0, 0, 8192), &small), NBD_EINVAL);
        small.structured = true;
        for cmd in [NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES, NBD_CMD_CACHE, NBD_CMD_BLOCK_STATUS] {
            assert!(validate_request(&hdr(cmd, 0, 0, 1 << 20), &small).is_ok(), "command {cmd}");
        }
        // Out of range beats too long: EINVAL / ENOSPC as for any request.
        assert_eq!(err(hdr(NBD_CMD_READ, 0, (1 << 20) - 4096, 8192), &small), NBD_EINVAL);
        let mut ro = p;
        ro.read_only = true;
        assert_eq!(err(hdr(NBD_CMD_WRITE, 0, 0, 1), &ro), NBD_EPERM);
        assert_eq!(err(hdr(NBD_CMD_TRIM, 0, 0, 1), &ro), NBD_EPERM);
        assert_eq!(err(hdr(NBD_CMD_WRITE_ZEROES, 0, 0, 1), &ro), NBD_EPERM);
        assert!(validate_request(&hdr(NBD_CMD_READ, 0, 0, 1), &ro).is_ok());
        let mut nometa = p;
        nometa.has_meta_context = false;
        assert_eq!(err(hdr(NBD_CMD_BLOCK_STATUS, 0, 0, 1), &nometa), NBD_EINVAL);
        let mut simple = p;
        simple.structured = false;
        assert_eq!(err(hdr(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 1), &simple), NBD_EINVAL);
        let mut aligned = p;
        aligned.min_block = 512;
        assert_eq!(err(hdr(NBD_CMD_READ, 0, 1, 512), &aligned), NBD_EINVAL);
        assert_eq!(err(hdr(NBD_CMD_WRITE, 0, 0, 100), &aligned), NBD_EINVAL);
        assert!(validate_request(&hdr(NBD_CMD_READ, 0, 512, 1024), &aligned).is_ok());
    }

    #[test]
    fn extended_requests() {
        let mut p = params();
        p.extended = true;
        p.size = 1 << 50;
        p.max_payload = 1 << 20;
        let err = |h: ExtendedRequestHeader, p: &TransmissionParams| validate_request(&h, p).unwrap_err().errno;
        let pl = NBD_CMD_FLAG_PAYLOAD_LEN;
        // A WRITE may carry PAYLOAD_LEN (qemu 10.0 does not); nothing else may.
        for flags in [pl | NBD_CMD_FLAG_FUA, NBD_CMD_FLAG_FUA] {
            assert_eq!(
                validate_request(&ext_hdr(NBD_CMD_WRITE, flags, 4096, 512), &p),
                Ok(Request::Write { offset: 4096, length: 512, fua: true })
            );
        }
        assert_eq!(err(ext_hdr(NBD_CMD_READ, pl, 0, 512), &p), NBD_EINVAL);
        assert_eq!(err(ext_hdr(NBD_CMD_BLOCK_STATUS, pl, 0, 16), &p), NBD_EINVAL);
        // 64-bit effect lengths reach the export unchanged.
        let big = 5u64 << 40;
        assert_eq!(
            validate_request(&ext_hdr(NBD_CMD_TRIM, 0, 4096, big), &p),
            Ok(Request::Trim { offset: 4096, length: big, fua: false })
        );
        assert_eq!(
            validate_request(&ext_hdr(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 0, big), &p),
            Ok(Request::WriteZeroes { offset: 0, length: big, no_hole: true, fast: false, fua: false })
        );
        assert_eq!(
            validate_request(&ext_hdr(NBD_CMD_CACHE, 0, 0, big), &p),
            Ok(Request::Cache { offset: 0, length: big })
        );
        assert_eq!(
            validate_request(&ext_hdr(NBD_CMD_BLOCK_STATUS, 0, 0, big), &p),
            Ok(Request::BlockStatus { offset: 0, length: big, req_one: false })
        );
        // Reads and writes stay bounded by the maximum payload, however
        // large the 64-bit length (nothing that size is ever allocated).
        assert_eq!(err(ext_hdr(NBD_CMD_READ, 0, 0, big), &p), NBD_EOVERFLOW);
        assert_eq!(err(ext_hdr(NBD_CMD_READ, 0, 0, (1 << 32) + 512), &p), NBD_EOVERFLOW);
        assert_eq!(err(ext_hdr(NBD_CMD_WRITE, pl, 0, (1 << 20) + 1), &p), NBD_EINVAL);
        assert_eq!(err(ext_hdr(NBD_CMD_READ, 0, 1, u64::MAX), &p), NBD_EINVAL);
        assert_eq!(err(ext_hdr(NBD_CMD_TRIM, 0, 0, (1 << 50) + 1), &p), NBD_EINVAL);
        assert_eq!(err(ext_hdr(NBD_CMD_FLUSH, 0, 0, 1 << 40), &p), NBD_EINVAL);
        // Compact requests may not use PAYLOAD_LEN at all.
        p.extended = false;
        assert_eq!(err(ext_hdr(NBD_CMD_WRITE, pl, 0, 512), &p), NBD_EINVAL);
    }

    #[test]
    fn headers_and_payloads() {
        let c = RequestHeader { flags: 0, command: NBD_CMD_WRITE, handle: 3, offset: 512, length: 4096 };
        let cb = encode_request_header(&c);
        assert_eq!(parse_header(&cb, false), Ok(c.into()));
        assert!(parse_header(&cb, true).is_err(), "compact header when extended was negotiated");
        let e =
            ExtendedRequestHeader { flags: NBD_CMD_FLAG_PAYLOAD_LEN, command: 1, handle: 3, offset: 512, length: 4096 };
        let eb = encode_extended_request_header(&e);
        assert_eq!(eb.len(), 32);
        assert_eq!(&eb[0..4], &[0x21, 0xe4, 0x1c, 0x71]);
        assert_eq!(&eb[24..32], &4096u64.to_be_bytes());
        assert_eq!(parse_header(&eb, true), Ok(e));
        assert!(parse_header(&eb, false).is_err(), "extended header without negotiation");
        assert!(parse_header(&eb[..31], true).is_err());
        // Payload bytes on the wire.
        assert_eq!(payload_len(&c.into(), false), 4096);
        assert_eq!(payload_len(&e, true), 4096);
        assert_eq!(payload_len(&ExtendedRequestHeader { flags: 0, ..e }, true), 4096);
        let read = ExtendedRequestHeader { command: NBD_CMD_READ, flags: 0, ..e };
        assert_eq!(payload_len(&read, false), 0);
        assert_eq!(payload_len(&read, true), 0);
        assert_eq!(payload_len(&ExtendedRequestHeader { flags: NBD_CMD_FLAG_PAYLOAD_LEN, ..read }, true), 4096);
    }
}
