//! Workspace paths as clients name them: checked before anything touches a file.

use std::fmt;

/// Longest workspace path accepted, in bytes.
pub const MAX_PATH: usize = 1024;
/// Longest single name accepted (the Linux `NAME_MAX`).
pub const MAX_NAME: usize = 255;

/// A path relative to `/workspace`: non-empty, no `..` or `.` components, not absolute, no
/// NUL or control characters, no empty components, bounded in length. Symlinks are handled
/// where the path is opened (`RESOLVE_BENEATH` in the agent).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkspacePath(String);

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty path.
    #[error("the path is empty")]
    Empty,
    /// Longer than [`MAX_PATH`] or a component longer than [`MAX_NAME`].
    #[error("the path is too long")]
    TooLong,
    /// Starts with `/`.
    #[error("the path must be relative to the workspace")]
    Absolute,
    /// Contains `.` or `..` or an empty component.
    #[error("the path may not contain '.', '..' or empty components")]
    Traversal,
    /// Contains NUL or another control character, or a backslash.
    #[error("the path contains a forbidden character")]
    BadCharacter,
}

impl WorkspacePath {
    /// Checks `raw`.
    pub fn parse(raw: &str) -> Result<Self, PathError> {
        if raw.is_empty() {
            return Err(PathError::Empty);
        }
        if raw.len() > MAX_PATH {
            return Err(PathError::TooLong);
        }
        if raw.starts_with('/') {
            return Err(PathError::Absolute);
        }
        if raw.chars().any(|c| c.is_control() || c == '\\') {
            return Err(PathError::BadCharacter);
        }
        for part in raw.split('/') {
            if part.is_empty() || part == "." || part == ".." {
                return Err(PathError::Traversal);
            }
            if part.len() > MAX_NAME {
                return Err(PathError::TooLong);
            }
        }
        Ok(WorkspacePath(raw.to_owned()))
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_paths_are_refused() {
        assert!(WorkspacePath::parse("src/main.rs").is_ok());
        assert!(WorkspacePath::parse(".gitignore").is_ok());
        assert!(WorkspacePath::parse("a..b/c").is_ok());
        for (bad, why) in [
            ("", PathError::Empty),
            ("/etc/passwd", PathError::Absolute),
            ("../data/coderoom.db", PathError::Traversal),
            ("a/../../b", PathError::Traversal),
            ("a/./b", PathError::Traversal),
            ("a//b", PathError::Traversal),
            ("a/", PathError::Traversal),
            ("a\0b", PathError::BadCharacter),
            ("a\nb", PathError::BadCharacter),
            ("a\\..\\b", PathError::BadCharacter),
        ] {
            assert_eq!(WorkspacePath::parse(bad), Err(why), "{bad:?}");
        }
        let long_name = "x".repeat(MAX_NAME + 1);
        assert_eq!(WorkspacePath::parse(&long_name), Err(PathError::TooLong));
        let long_path = vec!["y"; MAX_PATH].join("/");
        assert_eq!(WorkspacePath::parse(&long_path), Err(PathError::TooLong));
    }
}
