def set_defaults(params):
    return params
