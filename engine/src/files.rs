//! Writing files safely (whole or not at all) and reading them safely (regular files
//! only, within a bound derived from what they must hold).
//!
//! May call: nothing of the engine.

/// Writes `text` to `path` whole or not at all: a temporary name, fsync, rename.
pub fn write_atomically(path: &std::path::Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("'{}' names no file", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Checks that `path` is a regular file (not a folder, a device such as /dev/zero, a
/// FIFO or a socket, which would be read forever or block) of at most `max` bytes,
/// following symlinks; returns its size.
pub fn regular_size(path: &std::path::Path, max: u64) -> std::io::Result<u64> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("'{}' is not a regular file ({})", path.display(), kind(&meta)),
        ));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("'{}' holds {} bytes, more than the {max} it may", path.display(), meta.len()),
        ));
    }
    Ok(meta.len())
}

/// What kind of file `meta` describes, in words.
pub fn kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    if meta.is_dir() {
        "a folder"
    } else if meta.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Reads the regular file `path` whole, refusing special files and files over `max`
/// bytes (checked before and while reading: a file that grows is cut off at the bound).
pub fn read_bounded(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let size = regular_size(path, max)?;
    let file = std::fs::File::open(path)?;
    let mut out = Vec::with_capacity(size as usize);
    file.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("'{}' grew past the {max} bytes it may hold while being read", path.display()),
        ));
    }
    Ok(out)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_text_bounded(path: &std::path::Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_bounded(path, max)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("'{}' is not UTF-8 text", path.display())))
}
