//! The few librados functions tarn calls, resolved with `dlopen` at run
//! time: building tarn needs no Ceph headers or library, and a machine
//! without librados gets a clear error only when it opens a `rados://`
//! device. Signatures follow /usr/include/rados/librados.h (Ceph 16).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

pub type Rados = *mut c_void;
pub type Ioctx = *mut c_void;
pub type Completion = *mut c_void;
pub type WriteOp = *mut c_void;

/// `LIBRADOS_LOCK_FLAG_MAY_RENEW`: renew the lock if we already hold it.
pub const LOCK_FLAG_MAY_RENEW: u8 = 1;
/// `LIBRADOS_CREATE_EXCLUSIVE`: fail with EEXIST when the object exists.
pub const CREATE_EXCLUSIVE: c_int = 1;

macro_rules! api {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// Function pointers into the loaded librados.
        #[allow(non_snake_case)]
        pub struct Api { $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)* }

        fn resolve(lib: *mut c_void) -> Result<Api, String> {
            Ok(Api { $($name: {
                let sym = concat!(stringify!($name), "\0");
                // SAFETY: dlsym on a handle dlopen returned, with a NUL-terminated name.
                let p = unsafe { libc::dlsym(lib, sym.as_ptr().cast()) };
                if p.is_null() {
                    return Err(format!("librados has no symbol {}", stringify!($name)));
                }
                // SAFETY: the symbol is the librados function of this name,
                // whose C signature the declaration above repeats.
                unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
            },)* })
        }
    };
}

api! {
    rados_create2: fn(*mut Rados, *const c_char, *const c_char, u64) -> c_int;
    rados_conf_read_file: fn(Rados, *const c_char) -> c_int;
    rados_conf_set: fn(Rados, *const c_char, *const c_char) -> c_int;
    rados_connect: fn(Rados) -> c_int;
    rados_shutdown: fn(Rados) -> ();
    rados_ioctx_create: fn(Rados, *const c_char, *mut Ioctx) -> c_int;
    rados_ioctx_destroy: fn(Ioctx) -> ();
    rados_aio_create_completion2: fn(*mut c_void, *mut c_void, *mut Completion) -> c_int;
    rados_aio_wait_for_complete: fn(Completion) -> c_int;
    rados_aio_get_return_value: fn(Completion) -> c_int;
    rados_aio_release: fn(Completion) -> ();
    rados_aio_write: fn(Ioctx, *const c_char, Completion, *const c_char, usize, u64) -> c_int;
    rados_aio_read: fn(Ioctx, *const c_char, Completion, *mut c_char, usize, u64) -> c_int;
    rados_aio_remove: fn(Ioctx, *const c_char, Completion) -> c_int;
    rados_aio_flush: fn(Ioctx) -> c_int;
    rados_read: fn(Ioctx, *const c_char, *mut c_char, usize, u64) -> c_int;
    rados_create_write_op: fn() -> WriteOp;
    rados_release_write_op: fn(WriteOp) -> ();
    rados_write_op_create: fn(WriteOp, c_int, *const c_char) -> ();
    rados_write_op_write_full: fn(WriteOp, *const c_char, usize) -> ();
    rados_write_op_zero: fn(WriteOp, u64, u64) -> ();
    rados_write_op_write: fn(WriteOp, *const c_char, usize, u64) -> ();
    rados_aio_write_op_operate: fn(WriteOp, Ioctx, Completion, *const c_char, *mut libc::time_t, c_int) -> c_int;
    rados_write_op_operate: fn(WriteOp, Ioctx, *const c_char, *mut libc::time_t, c_int) -> c_int;
    rados_lock_exclusive: fn(Ioctx, *const c_char, *const c_char, *const c_char, *const c_char, *mut libc::timeval, u8) -> c_int;
    rados_unlock: fn(Ioctx, *const c_char, *const c_char, *const c_char) -> c_int;
    rados_list_lockers: fn(Ioctx, *const c_char, *const c_char, *mut c_int, *mut c_char, *mut usize, *mut c_char, *mut usize, *mut c_char, *mut usize, *mut c_char, *mut usize) -> isize;
    rados_break_lock: fn(Ioctx, *const c_char, *const c_char, *const c_char, *const c_char) -> c_int;
    rados_blocklist_add: fn(Rados, *mut c_char, u32) -> c_int;
    rados_getaddrs: fn(Rados, *mut *mut c_char) -> c_int;
    rados_buffer_free: fn(*mut c_char) -> ();
    rados_wait_for_latest_osdmap: fn(Rados) -> c_int;
    rados_get_instance_id: fn(Rados) -> u64;
}

/// The library, loaded once per process (an error is remembered too).
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|e| e.clone())
}

fn load() -> Result<Api, String> {
    let name = c"librados.so.2";
    // SAFETY: dlopen with a NUL-terminated name; the handle is never closed,
    // so the resolved pointers stay valid for the life of the process.
    let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        // SAFETY: dlerror returns a NUL-terminated string or NULL.
        let why = unsafe { libc::dlerror() };
        let why = if why.is_null() {
            String::from("unknown error")
        } else {
            // SAFETY: non-null, NUL-terminated (above).
            unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
        };
        return Err(format!("cannot load librados.so.2 ({why}); install librados2 (bash scripts/deps.sh)"));
    }
    resolve(lib)
}
