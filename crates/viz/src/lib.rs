//! Pictures of a tarn pool (`tarn map`) and of one volume's map (`tarn vol
//! map --png`): plain data in, a [`Scene`] out, written as PNG or SVG.
//! Nothing here touches a pool: the CLI gathers the figures (through the
//! control socket of a running server or on the pool itself) and hands
//! them over, so drawing stays out of the engine's data path.

pub mod palette;
pub mod pool;
pub mod scene;
pub mod volume;

pub use palette::volume_colour;
pub use pool::{Cell, DeviceMap, Fill, Holder, PoolMap};
pub use scene::{Group, Rgb, Scene, Shape};
pub use volume::{VolumeMap, VolumeRun};

use std::path::{Path, PathBuf};

/// Narrowest picture: room for a legend line of a few words.
pub const MIN_WIDTH: u32 = 320;
/// Widest picture (and tallest): a PNG of 8192 x 8192 is 192 MiB of pixels.
pub const MAX_WIDTH: u32 = 8192;

#[derive(Debug, thiserror::Error)]
pub enum VizError {
    #[error("width {0}: pictures are {MIN_WIDTH} to {MAX_WIDTH} pixels wide")]
    Width(u32),
    #[error("the picture would be {0} pixels tall (at most {MAX_WIDTH}): too many devices for one picture")]
    Height(u64),
    #[error("nothing to draw: {0}")]
    Empty(&'static str),
    #[error("write {path}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("encode {path} as PNG")]
    Png { path: PathBuf, source: png::EncodingError },
}

impl VizError {
    fn io(path: &Path, source: std::io::Error) -> VizError {
        VizError::Io { path: path.to_path_buf(), source }
    }

    fn png(path: &Path, source: png::EncodingError) -> VizError {
        VizError::Png { path: path.to_path_buf(), source }
    }
}

/// A width the pictures accept.
pub fn check_width(width: u32) -> Result<u32, VizError> {
    if (MIN_WIDTH..=MAX_WIDTH).contains(&width) {
        Ok(width)
    } else {
        Err(VizError::Width(width))
    }
}
