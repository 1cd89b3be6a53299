class Registry:
    mapping = {"datasetprocessor": {}}

    @classmethod
    def register_datasetprocessor(cls, name):
        def wrap(datasetprocessor_cls):
            if name in cls.mapping["datasetprocessor"]:
                raise KeyError(f"Name '{name}' already registered.")
            cls.mapping["datasetprocessor"][name] = datasetprocessor_cls
            return datasetprocessor_cls

        return wrap

    @classmethod
    def get_datasetprocessor(cls, name):
        return cls.mapping["datasetprocessor"].get(name)


registry = Registry()
