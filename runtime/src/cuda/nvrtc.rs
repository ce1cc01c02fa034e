//! Compiling CUDA C at run time with NVRTC, to PTX (read by checks) and to the GPU's machine code
//! (what is loaded). Loading machine code needs no JIT by the driver, so an NVRTC newer than the
//! driver (a Python environment's `nvidia-cuda-nvrtc` wheel next to an older driver) still works;
//! the driver refuses PTX of a newer ISA than its own.

use crate::{Error, Result};
use cudarc::nvrtc::{result, sys};
use std::ffi::{CString, c_char};

/// What NVRTC made of one source.
pub struct Compiled {
    pub ptx: String,
    /// The machine code (a cubin) for the real architecture the options named (`sm_XY`).
    pub cubin: Vec<u8>,
}

/// A program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by `create_program`, destroyed once here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn nvrtc_error(what: &str) -> impl Fn(result::NvrtcError) -> Error + '_ {
    move |e| Error::Backend(format!("NVRTC: {what}: {e:?}"))
}

/// Bytes of a NUL-terminated buffer, up to the NUL.
fn text(buffer: &[c_char]) -> String {
    let bytes: Vec<u8> = buffer
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// NVRTC's version, (major, minor).
pub fn version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for the call.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(nvrtc_error("reading its version"))?;
    Ok((major, minor))
}

/// Compiles `source` (called `name` in messages) with `options`, which must name a real
/// architecture (`--gpu-architecture=sm_XY`). A failed compilation's error carries NVRTC's log.
pub fn compile(source: &str, name: &str, options: &[String]) -> Result<Compiled> {
    let source_c = CString::new(source)
        .map_err(|_| Error::Backend(format!("{name}: the source holds a NUL byte")))?;
    let name_c = CString::new(name)
        .map_err(|_| Error::Backend(format!("{name}: the name holds a NUL byte")))?;
    let program = Program(
        result::create_program(&source_c, Some(&name_c))
            .map_err(nvrtc_error("creating a program"))?,
    );
    // SAFETY: `program` lives until the end of this function; the source and name outlive it.
    let compiled = unsafe { result::compile_program(program.0, options) };
    if let Err(e) = compiled {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(program.0) }
            .map(|l| text(&l))
            .unwrap_or_default();
        return Err(Error::Backend(format!(
            "NVRTC could not compile {name} ({}): {e:?}: {}",
            options.join(" "),
            log.trim()
        )));
    }
    // SAFETY: as above; the program compiled.
    let ptx = text(&unsafe { result::get_ptx(program.0) }.map_err(nvrtc_error("reading PTX"))?);
    let mut size = 0usize;
    // SAFETY: as above; `size` is valid for the call.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(nvrtc_error("sizing the machine code"))?;
    if size == 0 {
        return Err(Error::Backend(format!(
            "NVRTC made no machine code for {name} ({}): name a real architecture (sm_90), not a virtual one (compute_90)",
            options.join(" ")
        )));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds the `size` bytes NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(nvrtc_error("reading the machine code"))?;
    Ok(Compiled { ptx, cubin })
}
