//! Test inputs and properties, shared by the unit tests here, the kernel tests in `tests/` and the
//! fuzz targets in `tests/fuzz/`.

mod hello;
pub mod properties;

pub use hello::HelloBuilder;
