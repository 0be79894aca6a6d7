//! NBD wire protocol: constants and pure encode/decode functions (no I/O).
//!
//! Values are taken from the NBD protocol document (`doc/proto.md` of
//! NetworkBlockDevice/nbd). All integers on the wire are big-endian.
//! Every decoder returns `Err` on malformed input and never panics.

/// A malformed message seen by one of the pure decoders.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad magic: expected {expected:#x}, found {found:#x}")]
    BadMagic { expected: u64, found: u64 },
    #[error("message truncated: needed {needed} bytes, got {got}")]
    Truncated { needed: usize, got: usize },
    #[error("{extra} unexpected trailing bytes")]
    TrailingData { extra: usize },
    #[error("unknown or unadvertised client flags {0:#x}")]
    UnknownClientFlags(u32),
    #[error("string is not valid UTF-8 or contains NUL")]
    InvalidString,
    #[error("string of {0} bytes exceeds the 4096-byte limit")]
    StringTooLong(usize),
    #[error("duplicate information request {0}")]
    DuplicateInfo(u16),
}

// ---------------------------------------------------------------- magics

/// `NBDMAGIC`, first 8 bytes sent by the server (also `INIT_PASSWD`).
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle magic, sent by the server and before every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Oldstyle `cliserv_magic` (never sent: oldstyle is not supported).
pub const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
/// Magic of option replies.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_EXTENDED_REQUEST_MAGIC` (extended headers).
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// `NBD_EXTENDED_REPLY_MAGIC` (extended headers).
pub const EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;
/// `NBD_SIMPLE_REPLY_MAGIC`.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------- handshake flags

pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
/// Handshake flags this server sends.
pub const SERVER_HANDSHAKE_FLAGS: u16 = NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES;

pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---------------------------------------------------------------- transmission flags

pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;
pub const NBD_FLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

// ---------------------------------------------------------------- options

pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// ---------------------------------------------------------------- option replies

pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR + 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR + 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR + 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR + 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR + 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR + 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR + 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR + 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR + 9;
pub const NBD_REP_ERR_EXT_HEADER_REQD: u32 = NBD_REP_FLAG_ERROR + 10;

// ---------------------------------------------------------------- NBD_REP_INFO types

pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------- commands

pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
pub const NBD_CMD_RESIZE: u16 = 8;

pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const NBD_CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// ---------------------------------------------------------------- structured replies

pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const NBD_REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// ---------------------------------------------------------------- metadata contexts

pub const NBD_STATE_HOLE: u32 = 1 << 0;
pub const NBD_STATE_ZERO: u32 = 1 << 1;
/// The metadata context every export offers (from [`crate::Export::block_status`]).
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Prefix of qemu's changed-block-tracking contexts, `qemu:dirty-bitmap:NAME`
/// (qemu's `docs/interop/nbd.rst`); also a wildcard for NBD_OPT_LIST_META_CONTEXT.
pub const QEMU_DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";
/// Flag of `qemu:dirty-bitmap:*` extents: the range changed (0: clean).
pub const NBD_STATE_DIRTY: u32 = 1 << 0;

// ---------------------------------------------------------------- error values

pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_ENOMEM: u32 = 12;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;
pub const NBD_ENOTSUP: u32 = 95;
pub const NBD_ESHUTDOWN: u32 = 108;

// ---------------------------------------------------------------- sizes

/// Strings (names, messages) MUST be no longer than this.
pub const MAX_STRING_LEN: usize = 4096;
pub const GREETING_LEN: usize = 18;
pub const OPTION_HEADER_LEN: usize = 16;
pub const REQUEST_HEADER_LEN: usize = 28;
pub const SIMPLE_REPLY_LEN: usize = 16;
pub const STRUCTURED_HEADER_LEN: usize = 20;
/// Structured OFFSET_DATA chunk header including the 8-byte offset.
pub const READ_CHUNK_HEADER_LEN: usize = 28;
/// Extended request header (`NBD_EXTENDED_REQUEST_MAGIC`, 64-bit length).
pub const EXTENDED_REQUEST_HEADER_LEN: usize = 32;
/// Extended reply chunk header (`NBD_EXTENDED_REPLY_MAGIC`).
pub const EXTENDED_HEADER_LEN: usize = 32;
/// Longest header in front of a reply's data: an extended OFFSET_DATA
/// chunk header with its 8-byte offset.
pub const MAX_READ_HEAD_LEN: usize = EXTENDED_HEADER_LEN + 8;
/// Payload of an `NBD_REPLY_TYPE_OFFSET_HOLE` chunk: offset and size.
pub const HOLE_PAYLOAD_LEN: usize = 12;

// ---------------------------------------------------------------- helpers

fn be_u16(b: &[u8], at: usize) -> Result<u16, ProtocolError> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_be_bytes)
        .ok_or(ProtocolError::Truncated { needed: at + 2, got: b.len() })
}

fn be_u32(b: &[u8], at: usize) -> Result<u32, ProtocolError> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or(ProtocolError::Truncated { needed: at + 4, got: b.len() })
}

fn be_u64(b: &[u8], at: usize) -> Result<u64, ProtocolError> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or(ProtocolError::Truncated { needed: at + 8, got: b.len() })
}

/// Validate an NBD string: UTF-8, no NUL, at most [`MAX_STRING_LEN`] bytes.
pub fn parse_string(b: &[u8]) -> Result<String, ProtocolError> {
    if b.len() > MAX_STRING_LEN {
        return Err(ProtocolError::StringTooLong(b.len()));
    }
    if b.contains(&0) {
        return Err(ProtocolError::InvalidString);
    }
    std::str::from_utf8(b).map(str::to_owned).map_err(|_| ProtocolError::InvalidString)
}

/// Read a `u32 length` + string at `*pos`, advancing `*pos`.
fn take_lp_string(b: &[u8], pos: &mut usize) -> Result<String, ProtocolError> {
    let len = be_u32(b, *pos)? as usize;
    let start = *pos + 4;
    let end = start.checked_add(len).ok_or(ProtocolError::Truncated { needed: usize::MAX, got: b.len() })?;
    let s = b.get(start..end).ok_or(ProtocolError::Truncated { needed: end, got: b.len() })?;
    let s = parse_string(s)?;
    *pos = end;
    Ok(s)
}

/// Strings the server sends are truncated (at a char boundary) to the limit.
fn clamp_str(s: &str) -> &str {
    if s.len() <= MAX_STRING_LEN {
        return s;
    }
    let mut end = MAX_STRING_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

// ---------------------------------------------------------------- handshake

/// The server's first message: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    b
}

/// Client flags after validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Decode the client flags; unknown bits, or bits the server did not
/// advertise in `server_flags`, are an error (the server MUST disconnect).
pub fn parse_client_flags(raw: u32, server_flags: u16) -> Result<ClientFlags, ProtocolError> {
    let mut allowed = 0u32;
    if server_flags & NBD_FLAG_FIXED_NEWSTYLE != 0 {
        allowed |= NBD_FLAG_C_FIXED_NEWSTYLE;
    }
    if server_flags & NBD_FLAG_NO_ZEROES != 0 {
        allowed |= NBD_FLAG_C_NO_ZEROES;
    }
    if raw & !allowed != 0 {
        return Err(ProtocolError::UnknownClientFlags(raw));
    }
    Ok(ClientFlags { fixed_newstyle: raw & NBD_FLAG_C_FIXED_NEWSTYLE != 0, no_zeroes: raw & NBD_FLAG_C_NO_ZEROES != 0 })
}

/// Header of a client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Decode `IHAVEOPT`, option, length.
pub fn parse_option_header(b: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, ProtocolError> {
    let magic = be_u64(b, 0)?;
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadMagic { expected: IHAVEOPT, found: magic });
    }
    Ok(OptionHeader { option: be_u32(b, 8)?, length: be_u32(b, 12)? })
}

/// Append one option reply (magic, option, type, length, data) to `out`.
pub fn push_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    out.reserve(20 + data.len());
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    // Option data is bounded by the callers (strings <= 4096 bytes), the
    // saturation is only a guard.
    out.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(data);
}

/// One option reply as a vector.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    push_option_reply(&mut v, option, reply_type, data);
    v
}

/// Reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and 124 zero
/// bytes unless `NBD_FLAG_C_NO_ZEROES` was negotiated.
pub fn encode_export_name_reply(size: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(10 + 124);
    v.extend_from_slice(&size.to_be_bytes());
    v.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        v.extend_from_slice(&[0u8; 124]);
    }
    v
}

/// Data of `NBD_OPT_EXPORT_NAME`: the whole payload is the name.
pub fn parse_export_name(data: &[u8]) -> Result<String, ProtocolError> {
    parse_string(data)
}

/// Data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Decode `NBD_OPT_INFO` / `NBD_OPT_GO` data: u32 name length, name,
/// u16 count, count x u16. The lengths must add up exactly; a repeated
/// information request is an error (the client MUST NOT send one).
pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, ProtocolError> {
    let mut pos = 0;
    let name = take_lp_string(data, &mut pos)?;
    let n = be_u16(data, pos)? as usize;
    pos += 2;
    let need = pos + 2 * n;
    if data.len() < need {
        return Err(ProtocolError::Truncated { needed: need, got: data.len() });
    }
    if data.len() > need {
        return Err(ProtocolError::TrailingData { extra: data.len() - need });
    }
    let mut requests = Vec::with_capacity(n);
    for i in 0..n {
        let r = be_u16(data, pos + 2 * i)?;
        if requests.contains(&r) {
            return Err(ProtocolError::DuplicateInfo(r));
        }
        requests.push(r);
    }
    Ok(InfoRequest { name, requests })
}

/// Data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export_name: String,
    pub queries: Vec<String>,
}

/// Decode meta context option data: u32 name length, name, u32 query
/// count, then count x (u32 length, query). Must be consumed exactly.
pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, ProtocolError> {
    let mut pos = 0;
    let export_name = take_lp_string(data, &mut pos)?;
    let n = be_u32(data, pos)? as usize;
    pos += 4;
    // Each query takes at least 4 bytes: bound the allocation by the data.
    let remaining = data.len() - pos;
    if n > remaining / 4 {
        return Err(ProtocolError::Truncated { needed: pos + 4 * n.min(usize::MAX / 8), got: data.len() });
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        queries.push(take_lp_string(data, &mut pos)?);
    }
    if pos != data.len() {
        return Err(ProtocolError::TrailingData { extra: data.len() - pos });
    }
    Ok(MetaContextRequest { export_name, queries })
}

/// `NBD_REP_INFO` payload for `NBD_INFO_EXPORT`.
pub fn encode_info_export(size: u64, transmission_flags: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..2].copy_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
    b[2..10].copy_from_slice(&size.to_be_bytes());
    b[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    b
}

/// `NBD_REP_INFO` payload for `NBD_INFO_BLOCK_SIZE`.
pub fn encode_info_block_size(minimum: u32, preferred: u32, maximum: u32) -> [u8; 14] {
    let mut b = [0u8; 14];
    b[0..2].copy_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
    b[2..6].copy_from_slice(&minimum.to_be_bytes());
    b[6..10].copy_from_slice(&preferred.to_be_bytes());
    b[10..14].copy_from_slice(&maximum.to_be_bytes());
    b
}

/// `NBD_REP_INFO` payload for a string item (`NBD_INFO_NAME`, `NBD_INFO_DESCRIPTION`).
pub fn encode_info_string(info_type: u16, s: &str) -> Vec<u8> {
    let s = clamp_str(s);
    let mut v = Vec::with_capacity(2 + s.len());
    v.extend_from_slice(&info_type.to_be_bytes());
    v.extend_from_slice(s.as_bytes());
    v
}

/// `NBD_REP_SERVER` payload: u32 name length, name, description.
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let (name, description) = (clamp_str(name), clamp_str(description));
    let mut v = Vec::with_capacity(4 + name.len() + description.len());
    v.extend_from_slice(&(name.len() as u32).to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(description.as_bytes());
    v
}

/// `NBD_REP_META_CONTEXT` payload: u32 context id, name.
pub fn encode_rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let name = clamp_str(name);
    let mut v = Vec::with_capacity(4 + name.len());
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v
}

// ---------------------------------------------------------------- transmission

/// A decoded request header (the command may be unknown; see [`Command`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// Decode a 28-byte request header; a wrong magic is an error.
pub fn parse_request_header(b: &[u8; REQUEST_HEADER_LEN]) -> Result<RequestHeader, ProtocolError> {
    let magic = be_u32(b, 0)?;
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadMagic { expected: REQUEST_MAGIC as u64, found: magic as u64 });
    }
    Ok(RequestHeader {
        flags: be_u16(b, 4)?,
        command: be_u16(b, 6)?,
        handle: be_u64(b, 8)?,
        offset: be_u64(b, 16)?,
        length: be_u32(b, 24)?,
    })
}

/// A request header of either form, its length widened to 64 bits (the
/// extended form's *length*; the compact form's converts losslessly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendedRequestHeader {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u64,
}

impl From<RequestHeader> for ExtendedRequestHeader {
    fn from(h: RequestHeader) -> Self {
        ExtendedRequestHeader {
            flags: h.flags,
            command: h.command,
            handle: h.handle,
            offset: h.offset,
            length: h.length as u64,
        }
    }
}

/// Decode a 32-byte extended request header; a wrong magic is an error.
pub fn parse_extended_request_header(
    b: &[u8; EXTENDED_REQUEST_HEADER_LEN],
) -> Result<ExtendedRequestHeader, ProtocolError> {
    let magic = be_u32(b, 0)?;
    if magic != EXTENDED_REQUEST_MAGIC {
        return Err(ProtocolError::BadMagic { expected: EXTENDED_REQUEST_MAGIC as u64, found: magic as u64 });
    }
    Ok(ExtendedRequestHeader {
        flags: be_u16(b, 4)?,
        command: be_u16(b, 6)?,
        handle: be_u64(b, 8)?,
        offset: be_u64(b, 16)?,
        length: be_u64(b, 24)?,
    })
}

/// Encode an extended request header (used by tests and clients).
pub fn encode_extended_request_header(h: &ExtendedRequestHeader) -> [u8; EXTENDED_REQUEST_HEADER_LEN] {
    let mut b = [0u8; EXTENDED_REQUEST_HEADER_LEN];
    b[0..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&h.flags.to_be_bytes());
    b[6..8].copy_from_slice(&h.command.to_be_bytes());
    b[8..16].copy_from_slice(&h.handle.to_be_bytes());
    b[16..24].copy_from_slice(&h.offset.to_be_bytes());
    b[24..32].copy_from_slice(&h.length.to_be_bytes());
    b
}

/// Encode a request header (used by tests and clients).
pub fn encode_request_header(h: &RequestHeader) -> [u8; REQUEST_HEADER_LEN] {
    let mut b = [0u8; REQUEST_HEADER_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&h.flags.to_be_bytes());
    b[6..8].copy_from_slice(&h.command.to_be_bytes());
    b[8..16].copy_from_slice(&h.handle.to_be_bytes());
    b[16..24].copy_from_slice(&h.offset.to_be_bytes());
    b[24..28].copy_from_slice(&h.length.to_be_bytes());
    b
}

/// Known commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
}

impl Command {
    pub fn from_u16(v: u16) -> Option<Command> {
        Some(match v {
            NBD_CMD_READ => Command::Read,
            NBD_CMD_WRITE => Command::Write,
            NBD_CMD_DISC => Command::Disc,
            NBD_CMD_FLUSH => Command::Flush,
            NBD_CMD_TRIM => Command::Trim,
            NBD_CMD_CACHE => Command::Cache,
            NBD_CMD_WRITE_ZEROES => Command::WriteZeroes,
            NBD_CMD_BLOCK_STATUS => Command::BlockStatus,
            _ => return None,
        })
    }

    /// Command flags valid for this command (given negotiation state).
    pub fn allowed_flags(self, structured: bool) -> u16 {
        // FUA is valid on every command once NBD_FLAG_SEND_FUA is advertised
        // (which this server always does).
        NBD_CMD_FLAG_FUA
            | match self {
                Command::Read if structured => NBD_CMD_FLAG_DF,
                Command::WriteZeroes => NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
                Command::BlockStatus => NBD_CMD_FLAG_REQ_ONE,
                _ => 0,
            }
    }
}

/// A simple reply header.
pub fn encode_simple_reply(handle: u64, error: u32) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// A structured reply chunk header.
pub fn encode_structured_header(flags: u16, reply_type: u16, handle: u64, length: u32) -> [u8; STRUCTURED_HEADER_LEN] {
    let mut b = [0u8; STRUCTURED_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&reply_type.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&length.to_be_bytes());
    b
}

/// An extended reply chunk header; `request_offset` is the offset of the
/// request it answers (proto.md: it MUST match, even for OFFSET_DATA).
pub fn encode_extended_header(
    flags: u16,
    reply_type: u16,
    handle: u64,
    request_offset: u64,
    length: u64,
) -> [u8; EXTENDED_HEADER_LEN] {
    let mut b = [0u8; EXTENDED_HEADER_LEN];
    b[0..4].copy_from_slice(&EXTENDED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&reply_type.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..24].copy_from_slice(&request_offset.to_be_bytes());
    b[24..32].copy_from_slice(&length.to_be_bytes());
    b
}

/// How reply chunks are framed: structured (20-byte header, 32-bit
/// length) or, once `NBD_OPT_EXTENDED_HEADERS` was negotiated, extended
/// (32-byte header with the request's offset and a 64-bit length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkFraming {
    pub extended: bool,
    pub handle: u64,
    /// Offset of the request (sent in extended headers only).
    pub request_offset: u64,
}

impl ChunkFraming {
    /// Append a chunk header announcing `length` payload bytes. Structured
    /// lengths are 32 bits: callers bound payloads far below that (the
    /// saturation is only a guard).
    pub fn push_header(&self, out: &mut Vec<u8>, flags: u16, reply_type: u16, length: u64) {
        if self.extended {
            out.extend_from_slice(&encode_extended_header(flags, reply_type, self.handle, self.request_offset, length));
        } else {
            let len = u32::try_from(length).unwrap_or(u32::MAX);
            out.extend_from_slice(&encode_structured_header(flags, reply_type, self.handle, len));
        }
    }

    /// Header (and 8-byte offset) of an OFFSET_DATA chunk carrying
    /// `data_len` bytes read at `offset`; the data follows.
    pub fn read_data_head(&self, offset: u64, data_len: u64, done: bool) -> ([u8; MAX_READ_HEAD_LEN], usize) {
        let mut v = Vec::with_capacity(MAX_READ_HEAD_LEN);
        let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
        self.push_header(&mut v, flags, NBD_REPLY_TYPE_OFFSET_DATA, data_len.saturating_add(8));
        v.extend_from_slice(&offset.to_be_bytes());
        let mut b = [0u8; MAX_READ_HEAD_LEN];
        b[..v.len()].copy_from_slice(&v);
        (b, v.len())
    }

    /// Append an `NBD_REPLY_TYPE_OFFSET_HOLE` chunk: `size` (nonzero)
    /// bytes at `offset` read as zeroes.
    pub fn push_hole(&self, out: &mut Vec<u8>, offset: u64, size: u32, done: bool) {
        let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
        self.push_header(out, flags, NBD_REPLY_TYPE_OFFSET_HOLE, HOLE_PAYLOAD_LEN as u64);
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&size.to_be_bytes());
    }

    /// Append a final `NBD_REPLY_TYPE_ERROR` chunk with an optional message.
    pub fn push_error(&self, out: &mut Vec<u8>, error: u32, message: &str) {
        let mut msg = clamp_str(message);
        if msg.len() > u16::MAX as usize {
            msg = "";
        }
        self.push_header(out, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, 6 + msg.len() as u64);
        out.extend_from_slice(&error.to_be_bytes());
        out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        out.extend_from_slice(msg.as_bytes());
    }

    /// Append the final `NBD_REPLY_TYPE_NONE` chunk (success without data).
    pub fn push_none(&self, out: &mut Vec<u8>) {
        self.push_header(out, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
    }

    /// Append one block status chunk of `context_id`: `BLOCK_STATUS` with
    /// 32-bit descriptors, or with extended headers `BLOCK_STATUS_EXT`
    /// (descriptor count, 64-bit lengths and statuses). `descriptors`
    /// should not be empty; the caller guarantees it.
    pub fn push_block_status(&self, out: &mut Vec<u8>, context_id: u32, descriptors: &[BlockDescriptor], done: bool) {
        let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
        let n = descriptors.len() as u64;
        if self.extended {
            out.reserve(EXTENDED_HEADER_LEN + 8 + 16 * descriptors.len());
            self.push_header(out, flags, NBD_REPLY_TYPE_BLOCK_STATUS_EXT, 8 + 16 * n);
            out.extend_from_slice(&context_id.to_be_bytes());
            out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
            for d in descriptors {
                out.extend_from_slice(&(d.length as u64).to_be_bytes());
                out.extend_from_slice(&(d.status as u64).to_be_bytes());
            }
        } else {
            push_block_status_chunk(out, self.handle, context_id, descriptors, done);
        }
    }
}

/// Header of an `NBD_REPLY_TYPE_OFFSET_DATA` chunk carrying `data_len`
/// bytes at `offset` (the data itself follows). `data_len` must be at most
/// `u32::MAX - 8`; larger values are clamped (callers bound reads far lower).
pub fn encode_read_chunk_header(handle: u64, offset: u64, data_len: u32, done: bool) -> [u8; READ_CHUNK_HEADER_LEN] {
    let mut b = [0u8; READ_CHUNK_HEADER_LEN];
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    let len = data_len.saturating_add(8);
    b[0..20].copy_from_slice(&encode_structured_header(flags, NBD_REPLY_TYPE_OFFSET_DATA, handle, len));
    b[20..28].copy_from_slice(&offset.to_be_bytes());
    b
}

/// The final `NBD_REPLY_TYPE_NONE` chunk.
pub fn encode_none_chunk(handle: u64) -> [u8; STRUCTURED_HEADER_LEN] {
    encode_structured_header(NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, handle, 0)
}

/// A final `NBD_REPLY_TYPE_ERROR` chunk with an optional message.
pub fn encode_error_chunk(handle: u64, error: u32, message: &str) -> Vec<u8> {
    let mut msg = clamp_str(message);
    // Message length is 16 bits; strings are limited to 4096 anyway.
    if msg.len() > u16::MAX as usize {
        msg = "";
    }
    let len = 6 + msg.len();
    let mut v = Vec::with_capacity(STRUCTURED_HEADER_LEN + len);
    v.extend_from_slice(&encode_structured_header(NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, handle, len as u32));
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    v.extend_from_slice(msg.as_bytes());
    v
}

/// One block status descriptor (of any metadata context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockDescriptor {
    pub length: u32,
    pub status: u32,
}

/// A final `NBD_REPLY_TYPE_BLOCK_STATUS` chunk. `descriptors` should not be
/// empty (the protocol requires at least one); the caller guarantees it.
pub fn encode_block_status_chunk(handle: u64, context_id: u32, descriptors: &[BlockDescriptor]) -> Vec<u8> {
    let mut v = Vec::new();
    push_block_status_chunk(&mut v, handle, context_id, descriptors, true);
    v
}

/// Append one `NBD_REPLY_TYPE_BLOCK_STATUS` chunk to `out`; `done` sets
/// `NBD_REPLY_FLAG_DONE` (only on the last chunk of a reply with several
/// contexts). `descriptors` should not be empty; the caller guarantees it.
pub fn push_block_status_chunk(
    out: &mut Vec<u8>,
    handle: u64,
    context_id: u32,
    descriptors: &[BlockDescriptor],
    done: bool,
) {
    let len = 4 + 8 * descriptors.len();
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    out.reserve(STRUCTURED_HEADER_LEN + len);
    out.extend_from_slice(&encode_structured_header(
        flags,
        NBD_REPLY_TYPE_BLOCK_STATUS,
        handle,
        u32::try_from(len).unwrap_or(u32::MAX),
    ));
    out.extend_from_slice(&context_id.to_be_bytes());
    for d in descriptors {
        out.extend_from_slice(&d.length.to_be_bytes());
        out.extend_from_slice(&d.status.to_be_bytes());
    }
}

/// The client side of NBD_OPT_LIST/SET_META_CONTEXT option data: export
/// name and queries, each length-prefixed (for clients, tests and fuzzing).
pub fn encode_meta_context_request(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_golden() {
        let g = encode_greeting(SERVER_HANDSHAKE_FLAGS);
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..18], &[0, 3]);
    }

    #[test]
    fn client_flags() {
        let f = parse_client_flags(3, SERVER_HANDSHAKE_FLAGS).unwrap();
        assert!(f.fixed_newstyle && f.no_zeroes);
        let f = parse_client_flags(0, SERVER_HANDSHAKE_FLAGS).unwrap();
        assert!(!f.fixed_newstyle && !f.no_zeroes);
        assert_eq!(parse_client_flags(4, SERVER_HANDSHAKE_FLAGS), Err(ProtocolError::UnknownClientFlags(4)));
        assert!(parse_client_flags(0x8000_0001, SERVER_HANDSHAKE_FLAGS).is_err());
        // NO_ZEROES not advertised: the client may not set it.
        assert!(parse_client_flags(2, NBD_FLAG_FIXED_NEWSTYLE).is_err());
    }

    #[test]
    fn option_header() {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(b"IHAVEOPT");
        b[8..12].copy_from_slice(&7u32.to_be_bytes());
        b[12..16].copy_from_slice(&13u32.to_be_bytes());
        assert_eq!(parse_option_header(&b).unwrap(), OptionHeader { option: 7, length: 13 });
        b[0] = b'X';
        assert!(matches!(parse_option_header(&b), Err(ProtocolError::BadMagic { .. })));
    }

    #[test]
    fn option_reply_golden() {
        let r = encode_option_reply(NBD_OPT_LIST, NBD_REP_ACK, &[]);
        assert_eq!(r, [0, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0]);
        let r = encode_option_reply(NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, b"no");
        assert_eq!(&r[8..20], &[0, 0, 0, 7, 0x80, 0, 0, 6, 0, 0, 0, 2]);
        assert_eq!(&r[20..], b"no");
    }

    #[test]
    fn export_name_reply() {
        let r = encode_export_name_reply(0x1000, 0x0101, false);
        assert_eq!(r.len(), 134);
        assert_eq!(&r[0..10], &[0, 0, 0, 0, 0, 0, 0x10, 0, 1, 1]);
        assert!(r[10..].iter().all(|&b| b == 0));
        assert_eq!(encode_export_name_reply(1, 1, true).len(), 10);
    }

    #[test]
    fn info_request_ok() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"mem");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&NBD_INFO_NAME.to_be_bytes());
        let r = parse_info_request(&d).unwrap();
        assert_eq!(r.name, "mem");
        assert_eq!(r.requests, vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME]);
        // Empty name, no requests.
        let r = parse_info_request(&[0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(r, InfoRequest { name: String::new(), requests: vec![] });
    }

    #[test]
    fn info_request_malformed() {
        // Every prefix of a valid request is invalid.
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"mem");
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&3u16.to_be_bytes());
        for i in 0..d.len() {
            assert!(parse_info_request(&d[..i]).is_err(), "prefix {i}");
        }
        // Trailing data.
        let mut t = d.clone();
        t.push(0);
        assert!(matches!(parse_info_request(&t), Err(ProtocolError::TrailingData { extra: 1 })));
        // Name length past the end, including a huge one.
        let mut h = d.clone();
        h[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&h).is_err());
        // Request count too large.
        let mut c = d.clone();
        c[7..9].copy_from_slice(&0xffffu16.to_be_bytes());
        assert!(parse_info_request(&c).is_err());
        // Invalid UTF-8 and NUL in name.
        let mut u = d.clone();
        u[4] = 0xff;
        assert_eq!(parse_info_request(&u), Err(ProtocolError::InvalidString));
        let mut n = d.clone();
        n[4] = 0;
        assert_eq!(parse_info_request(&n), Err(ProtocolError::InvalidString));
        // Duplicate info request.
        let mut dup = Vec::new();
        dup.extend_from_slice(&0u32.to_be_bytes());
        dup.extend_from_slice(&2u16.to_be_bytes());
        dup.extend_from_slice(&3u16.to_be_bytes());
        dup.extend_from_slice(&3u16.to_be_bytes());
        assert_eq!(parse_info_request(&dup), Err(ProtocolError::DuplicateInfo(3)));
        // Too-long name.
        let mut long = Vec::new();
        long.extend_from_slice(&5000u32.to_be_bytes());
        long.extend_from_slice(&[b'a'; 5000]);
        long.extend_from_slice(&0u16.to_be_bytes());
        assert_eq!(parse_info_request(&long), Err(ProtocolError::StringTooLong(5000)));
    }

    fn meta(name: &str, queries: &[&str]) -> Vec<u8> {
        encode_meta_context_request(name, queries)
    }

    #[test]
    fn meta_context_request() {
        let d = meta("mem", &["base:allocation", "qemu:dirty-bitmap:x"]);
        let r = parse_meta_context_request(&d).unwrap();
        assert_eq!(r.export_name, "mem");
        assert_eq!(r.queries, vec!["base:allocation", "qemu:dirty-bitmap:x"]);
        for i in 0..d.len() {
            assert!(parse_meta_context_request(&d[..i]).is_err(), "prefix {i}");
        }
        let mut t = d.clone();
        t.extend_from_slice(&[1, 2]);
        assert!(parse_meta_context_request(&t).is_err());
        // Absurd query count.
        let mut c = meta("", &[]);
        c[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta_context_request(&c).is_err());
        let r = parse_meta_context_request(&meta("", &[])).unwrap();
        assert!(r.queries.is_empty());
    }

    #[test]
    fn info_replies_golden() {
        assert_eq!(encode_info_export(512, 0x0d6d), [0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0x0d, 0x6d]);
        assert_eq!(encode_info_block_size(1, 4096, 32 << 20), [0, 3, 0, 0, 0, 1, 0, 0, 0x10, 0, 0x02, 0, 0, 0]);
        assert_eq!(encode_info_string(NBD_INFO_NAME, "ab"), [0, 1, b'a', b'b']);
        assert_eq!(encode_rep_server("ab", "d"), [0, 0, 0, 2, b'a', b'b', b'd']);
        assert_eq!(encode_rep_meta_context(1, "x:y"), [0, 0, 0, 1, b'x', b':', b'y']);
        let long = "é".repeat(3000); // 6000 bytes, clamped at a char boundary
        let e = encode_info_string(NBD_INFO_DESCRIPTION, &long);
        assert_eq!(e.len(), 2 + 4096);
        assert!(std::str::from_utf8(&e[2..]).is_ok());
    }

    #[test]
    fn request_header_roundtrip_and_golden() {
        let h =
            RequestHeader { flags: 1, command: NBD_CMD_WRITE, handle: 0x0102030405060708, offset: 4096, length: 512 };
        let b = encode_request_header(&h);
        assert_eq!(
            b,
            [0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 2, 0]
        );
        assert_eq!(parse_request_header(&b).unwrap(), h);
        let mut bad = b;
        bad[3] = 0x14;
        assert!(matches!(parse_request_header(&bad), Err(ProtocolError::BadMagic { .. })));
        assert!(parse_request_header(&[0u8; 28]).is_err());
    }

    #[test]
    fn commands_and_flags() {
        assert_eq!(Command::from_u16(0), Some(Command::Read));
        assert_eq!(Command::from_u16(7), Some(Command::BlockStatus));
        assert_eq!(Command::from_u16(8), None);
        assert_eq!(Command::from_u16(0xffff), None);
        assert_eq!(Command::Read.allowed_flags(false), NBD_CMD_FLAG_FUA);
        assert_eq!(Command::Read.allowed_flags(true), NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_DF);
        assert_eq!(Command::WriteZeroes.allowed_flags(false), 0b10011);
        assert_eq!(Command::BlockStatus.allowed_flags(true), 0b1001);
    }

    #[test]
    fn reply_golden() {
        assert_eq!(
            encode_simple_reply(0xaabb, NBD_EINVAL),
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0xaa, 0xbb]
        );
        let h = encode_read_chunk_header(9, 4096, 512, true);
        assert_eq!(
            h,
            [0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 2, 8, 0, 0, 0, 0, 0, 0, 0x10, 0]
        );
        assert_eq!(encode_none_chunk(1)[4..8], [0, 1, 0, 0]);
        let e = encode_error_chunk(5, NBD_EIO, "bad");
        assert_eq!(e.len(), 20 + 9);
        assert_eq!(&e[4..8], &[0, 1, 0x80, 1]);
        assert_eq!(&e[16..20], &[0, 0, 0, 9]);
        assert_eq!(&e[20..], &[0, 0, 0, 5, 0, 3, b'b', b'a', b'd']);
        let bs = encode_block_status_chunk(
            2,
            1,
            &[BlockDescriptor { length: 4096, status: 3 }, BlockDescriptor { length: 512, status: 0 }],
        );
        assert_eq!(&bs[4..8], &[0, 1, 0, 5]);
        assert_eq!(&bs[16..20], &[0, 0, 0, 20]);
        assert_eq!(&bs[20..], &[0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 3, 0, 0, 2, 0, 0, 0, 0, 0]);
        // Two chunks appended to one buffer: only the second one is DONE.
        let mut two = Vec::new();
        push_block_status_chunk(&mut two, 2, 7, &[BlockDescriptor { length: 512, status: 1 }], false);
        push_block_status_chunk(&mut two, 2, 1, &[BlockDescriptor { length: 512, status: 0 }], true);
        assert_eq!(two.len(), 2 * (20 + 12));
        assert_eq!(&two[4..8], &[0, 0, 0, 5]);
        assert_eq!(&two[20..24], &[0, 0, 0, 7]);
        assert_eq!(&two[36..40], &[0, 1, 0, 5]);
        assert_eq!(&two[32 + 20..32 + 24], &[0, 0, 0, 1]);
    }

    /// Cheap deterministic fuzzing: no decoder panics on random input.
    #[test]
    fn fuzz_decoders_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Bias towards small length fields so that structure gets explored.
            if len >= 4 && next() % 2 == 0 {
                d[0..4].copy_from_slice(&((next() % 8) as u32).to_be_bytes());
            }
            let _ = parse_info_request(&d);
            let _ = parse_meta_context_request(&d);
            let _ = parse_export_name(&d);
            let mut h = [0u8; 28];
            for b in h.iter_mut() {
                *b = next() as u8;
            }
            if next() % 2 == 0 {
                h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            }
            let _ = parse_request_header(&h);
            let mut o = [0u8; 16];
            o.copy_from_slice(&h[0..16]);
            let _ = parse_option_header(&o);
            let _ = parse_client_flags(next() as u32, SERVER_HANDSHAKE_FLAGS);
        }
    }
}
