//! Validation of request headers against the negotiated session (pure).

use crate::protocol::*;

/// What the validator needs to know about the negotiated session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TransmissionParams {
    pub size: u64,
    pub read_only: bool,
    pub structured: bool,
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
        length: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        no_hole: bool,
        fast: bool,
        fua: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
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

/// Validate a request header against the session (pure).
pub(crate) fn validate_request(h: &RequestHeader, p: &TransmissionParams) -> Result<Request, Rejection> {
    let Some(cmd) = Command::from_u16(h.command) else {
        return Err(reject(NBD_EINVAL, "unknown command"));
    };
    if h.flags & !cmd.allowed_flags(p.structured) != 0 {
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
    if length == 0 {
        return Err(reject(NBD_EINVAL, "zero-length request"));
    }
    let Some(end) = offset.checked_add(length as u64) else {
        return Err(reject(NBD_EINVAL, "offset + length overflows"));
    };
    if end > p.size {
        return Err(match cmd {
            Command::Write | Command::WriteZeroes => reject(NBD_ENOSPC, "write beyond the end of the export"),
            _ => reject(NBD_EINVAL, "request beyond the end of the export"),
        });
    }
    if matches!(cmd, Command::Read | Command::Write) && length > p.max_payload {
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
        if offset % m != 0 || (length as u64 % m != 0 && end != p.size) {
            return Err(reject(NBD_EINVAL, "request not aligned to the minimum block size"));
        }
    }
    Ok(match cmd {
        Command::Read => Request::Read { offset, length, df: h.flags & NBD_CMD_FLAG_DF != 0 },
        Command::Write => Request::Write { offset, length, fua },
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> TransmissionParams {
        TransmissionParams {
            size: 1 << 20,
            read_only: false,
            structured: true,
            has_meta_context: true,
            min_block: 1,
            max_payload: 32 << 20,
        }
    }

    fn hdr(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader { flags, command, handle: 7, offset, length }
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
        let err = |h: RequestHeader, p: &TransmissionParams| validate_request(&h, p).unwrap_err().errno;
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
}
