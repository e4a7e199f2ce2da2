"""attnprof plugged into other libraries' attention hooks (each module imports its library only when used)."""
